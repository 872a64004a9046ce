// Package monotime is the process's monotonic clock as plain nanoseconds: a timestamp to carry
// through a hot path (a request's start, a deadline, a group's submission) is one int64 and
// one clock read, where a time.Time is three words and time.Now reads both clocks.
package monotime

import "time"

// origin is the clock's zero, taken when the process starts.
var origin = time.Now()

// Now returns the nanoseconds since the process started, from the monotonic clock: only
// differences between its values mean anything.
func Now() int64 { return int64(time.Since(origin)) }

// Package bench holds the workloads and the harness behind `ringkeeper bench`.
//
// Every workload reports a Result of the same shape (see Result) so that runs can be compared
// by machines: operations, payload bytes (MB = 10^6 bytes of entry payload), duration,
// throughput and HdrHistogram latency percentiles. Progress goes to a writer once a second.
package bench

package index

import (
	"context"
	"fmt"
	"log/slog"
)

// pebbleLogger routes pebble's log lines to slog: Infof at Debug level (pebble reports every
// flush, compaction and WAL recovery), Errorf at Error level.
type pebbleLogger struct{ l *slog.Logger }

func (p pebbleLogger) Infof(format string, args ...any) {
	if p.l.Enabled(context.Background(), slog.LevelDebug) {
		p.l.Debug(fmt.Sprintf(format, args...), "component", "pebble")
	}
}

func (p pebbleLogger) Errorf(format string, args ...any) {
	p.l.Error(fmt.Sprintf(format, args...), "component", "pebble")
}

// Fatalf is called by pebble on states it cannot continue from (a failed WAL write or fsync,
// a corrupt manifest) and must not return. It logs, then panics with a *fatalError rather
// than exiting: a commit recovers it (Batch.commitPebble); in pebble's own goroutines it ends
// the process.
func (p pebbleLogger) Fatalf(format string, args ...any) {
	err := &fatalError{msg: fmt.Sprintf(format, args...)}
	for _, a := range args {
		if e, ok := a.(error); ok {
			err.cause = e
			break
		}
	}
	p.l.Error(err.msg, "component", "pebble", "fatal", true)
	panic(err)
}

// fatalError is what pebbleLogger.Fatalf panics with: pebble's message, and the error among
// its arguments (a failed write's ENOSPC or EIO), which it wraps.
type fatalError struct {
	msg   string
	cause error
}

func (e *fatalError) Error() string { return "pebble fatal error: " + e.msg }
func (e *fatalError) Unwrap() error { return e.cause }

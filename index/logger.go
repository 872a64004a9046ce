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
// a corrupt manifest) and must not return. It logs, then panics rather than exiting, so the
// caller's recover and deferred cleanups still run; the process must not keep using the index.
func (p pebbleLogger) Fatalf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	p.l.Error(msg, "component", "pebble", "fatal", true)
	panic("index: pebble fatal error: " + msg)
}

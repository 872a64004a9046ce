package bookie

import (
	"context"
	"errors"
	"testing"

	"github.com/ringkeeper/ringkeeper/internal/diskio"
	"github.com/ringkeeper/ringkeeper/metadata/metadatatest"
	"github.com/ringkeeper/ringkeeper/net/protocol"
)

// TestSecondStartOnSameDirsIsRefusedAndHarmless: a second `ringkeeper bookie` started
// by mistake with the same configuration (same dirs, same port) fails, as it should; but
// before it finds out (pebble's lock, then the port), it has opened the ledger dir's entry
// log, which allocates and creates a new log file there. The running bookie then collides
// with that file when it rolls over to its next entry log, and fails its adds.
// A second bookie started on a running one's directories (systemd plus a manual start) is
// refused before it touches them (diskio's directory lock), with an error that says why; it
// used to create the next entry log on its way to failing, which the running bookie then
// failed on at its next roll-over.
func TestSecondStartOnSameDirsIsRefusedAndHarmless(t *testing.T) {
	uri := metadatatest.URI(t)
	cfg := testConfig(t, uri, t.TempDir())
	cfg.Engine.EntryLogSizeLimit = 1 << 20
	cfg.Server.MaxFrameSize = 64 << 10
	cfg.Engine.Journal.MaxRecordSize = 64 << 10
	a := start(t, cfg)
	c := dial(t, a)
	if rc, err := c.Add(key, entry(1, 0), 0); err != nil || rc != protocol.EOK {
		t.Fatalf("add: %v %v", rc, err)
	}
	b, err := Start(context.Background(), cfg)
	if err == nil {
		b.Close(context.Background())
		t.Fatal("a second bookie on the same dirs and port started")
	}
	if !errors.Is(err, diskio.ErrLocked) {
		t.Errorf("second start: %v, want diskio.ErrLocked", err)
	}
	// About 6 MiB of adds: the running bookie's entry log rolls over several times (checkpoints
	// flush the write cache to it).
	for e := int64(1); e < 10000; e++ {
		if rc, err := c.Add(key, entry(1, e), 0); err != nil || rc != protocol.EOK {
			t.Fatalf("running bookie, add %d after the failed second start: rc %v err %v; engine: %v", e, rc, err, a.Engine().Err())
		}
		if e%500 == 0 {
			if err := a.Engine().Checkpoint(); err != nil {
				t.Fatalf("running bookie, checkpoint after the failed second start (add %d): %v", e, err)
			}
		}
	}
}

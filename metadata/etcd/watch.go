package etcd

import (
	"context"
	"time"
)

// resyncBackoff is the pause between attempts to re-read after a watch
// broke and the read failed too.
const resyncBackoff = 200 * time.Millisecond

// offerLatest puts v in ch (capacity 1), replacing a value the reader has not
// taken yet. The caller must be ch's only sender; then it never blocks.
func offerLatest[T any](ch chan T, v T) {
	for {
		select {
		case ch <- v:
			return
		default:
		}
		select {
		case <-ch:
		default:
		}
	}
}

// sleepCtx waits for d or until ctx is done; it reports whether ctx is still
// live.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

package transport

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/net/protocol"
)

// TestReadContextEndsAWaitOnAFullQueue: a read whose caller blocks on a full queue (the
// bookie has not answered AUTH) returns when its context ends, long before its timeout; its
// callback gets the context's error and the read is never sent.
func TestReadContextEndsAWaitOnAFullQueue(t *testing.T) {
	fb := newFakeBookie(t)
	p := newPool(t, Config{AuthPlugin: "plug", MaxFrameSize: 4096, MaxQueuedBytesPerConn: 4096,
		AddTimeout: 10 * time.Second, ReadTimeout: 10 * time.Second})
	conn := p.Conn(fb.addr())
	col := newCollector(4)
	conn.Add(1, 0, &keyA, 0, parts(1, 0, make([]byte, 4030)), col.onAdd, "add") // 4090 bytes: no read fits beside it
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	start := time.Now()
	conn.ReadContext(ctx, 1, 5, 0, nil, col.onRead, "read")
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("ReadContext returned %v after its context ended", took-100*time.Millisecond)
	}
	if r := col.one(t); r.ctx != "read" || !errors.Is(r.err, context.Canceled) {
		t.Fatalf("callback %v: %v, want the read's, with context.Canceled", r.ctx, r.err)
	}
	fc := fb.accept(t)
	if req := fc.next(t); req.Header.Op != protocol.OpAuth {
		t.Fatalf("first request %v", req.Header.Op)
	}
	fc.answerAuth(t)
	if req := fc.next(t); req.Header.Op != protocol.OpAddEntry {
		t.Fatalf("after AUTH: %v, want the add", req.Header.Op)
	}
	fc.answerAdd(t, 1, 0, protocol.EOK)
	if r := col.one(t); r.ctx != "add" || r.err != nil {
		t.Fatalf("add: %v", r.err)
	}
	if n := conn.Stats().Pending; n != 0 {
		t.Fatalf("%d requests pending; the canceled read must not be", n)
	}
}

// Package transport is the client side of BookKeeper's v2 wire protocol (package
// net/protocol): one multiplexed, pipelined connection per bookie, shared by every ledger of a
// client (BookKeeper's numChannelsPerBookie=1), with per-request timeouts, reconnection with
// backoff, TLS and AUTH. The client library builds quorum writes, recovery and reads on it.
//
//	pool, err := transport.NewPool(cfg)
//	conn := pool.Conn("10.0.0.7:3181")          // lazily connecting; never nil
//	conn.Add(ledger, entry, &key, 0, [][]byte{hdrAndDigest, payload}, onAdd, op)
//	conn.Read(ledger, entry, 0, nil, onRead, op)
//
// # Goroutines
//
// Per connection (only while one is up or being made):
//
//	caller ──Add/Read──▶ encode into wbuf (under Conn.mu) + register pending
//	                          │ signal
//	connect+writer goroutine ─┴─ dial, TLS, AUTH; then loop: swap wbuf ↔ spare, one Write
//	reader goroutine ─────────── Read → SplitFrame → DecodeResponse → match → callback
//
// and per pool, one completer goroutine that every tick (a tenth of the shorter timeout,
// 1–100 ms) fails the requests past their deadline with ErrTimeout, and that delivers the
// failures decided on a caller's goroutine (ErrEntryTooLarge, ErrBadRequest,
// ErrTooManyPending, ErrClosed, ErrConnection during backoff). A callback therefore never runs
// on the goroutine that called Add or Read, so a caller may hold a lock across Add that its
// callback takes. The one exception is a request made after Pool.Close has returned: no
// goroutine is left, and its callback (ErrClosed) runs before Add returns.
//
// Callbacks run on the reader goroutine (responses), on the connection's goroutines
// (connection failures) or on the completer (timeouts, local failures). They must not block:
// a blocked callback stops every response of its connection, or every timeout of the pool.
// A read callback's entry aliases the receive buffer and is valid only during the call.
//
// Pool.Close closes every connection, fails every pending request with ErrClosed and returns
// only when every callback has run and every goroutine has exited.
//
// # Matching
//
// v2 add and read requests carry no request id: a response says only (op, ledgerId,
// entryId). Each connection keeps its pending requests in a map keyed by (op, ledgerId,
// entryId), with a FIFO chain per key, since a client may have two requests for one key in
// flight (a retried add, a speculative read to the same bookie): the first response for a
// key completes the oldest request with that key. Responses for different keys may come in
// any order (the bookie's read workers answer out of order); each is matched by its key.
// A request that times out after it was queued for sending may still be answered: it leaves a
// ghost in its key's chain, and the response that reaches the ghost is dropped, like one that
// matches nothing; both are counted (ConnStats.Unmatched) and logged at debug level. A ghost
// stays until its answer comes or the connection ends, and counts toward MaxPendingPerConn.
// The bookie may answer two requests of one kind for one key in either order, so a newer one
// may take the late answer and the ghost its own; for the same entry on the same bookie both
// carry the same data, so this is harmless, as it is in BookKeeper.
// Two requests for one key that differ in the flags that change what the bookie does (a
// fencing and a plain read of one entry, LAC read included; a recovery and a plain add) are
// never in flight together, since the bookie may answer them in either order and nothing in a
// v2 response tells them apart: a recoverer could take a tailing reader's answer for proof of
// the fence before the bookie applied it. Such a request is held (not sent) until the last
// request of the other kind with its key is done (answered, or failed with the connection;
// one that timed out after it was queued for sending is done when its late answer comes, as
// the bookie may still process it), then sent; requests with that key that arrive meanwhile
// queue behind it in order, so neither kind starves. A held request counts toward MaxPendingPerConn and MaxQueuedBytesPerConn (its
// frame is encoded when held), times out at its own deadline without being sent, and fails
// with the connection. FlagHighPriority changes no kind. Without such a pair nothing is held
// (ConnStats.Held counts the requests that were).
//
// An add's response carries the ids from the stored entry's header, so Add checks that the
// header matches its ledgerID and entryID arguments (ErrBadRequest otherwise).
//
// # Timeouts
//
// Every request gets a deadline at submission: AddTimeout or ReadTimeout later. Pending
// requests are also linked in one list per op in deadline order (as all requests of an op
// share a timeout, that is submission order, except for a caller that blocked on a full
// queue: its request is linked in by its deadline), and the completer's scan stops at the
// first request not yet due. Deadlines saturate: a huge timeout means none. A timed-out
// request's callback gets ErrTimeout, and a late response for it is dropped (see Matching).
// Timeouts do not close the connection. A request queued
// while the connection is still being made is subject to the same deadline.
//
// # Connections, failures and backoff
//
// A connection is made on the first request (Pool.Conn does not dial). While it is being made
// (dial, TLS handshake, AUTH, all within DialTimeout) requests queue in its write buffer and
// go out once it is up: the AUTH request is always the first frame, and nothing else is sent
// before the bookie's AUTH response.
//
// When an attempt fails (dial, handshake, AUTH), every pending request fails (ErrConnection;
// ErrAuth for the AUTH exchange) and the connection enters backoff: ReconnectMin after the
// first failure, doubling up to ReconnectMax. During the backoff Healthy reports false and
// requests fail at once with ErrConnection, so the client can pick another bookie; the first
// request after it reconnects. When an established connection fails (write or read error,
// the bookie closed it, an undecodable or oversize response frame), every pending request
// fails with ErrConnection and the next request reconnects at once. A connection that dies
// within stableConnectionAge (1 s) of being made counts as a failed attempt, except the first
// one after a connection that lived longer: a bookie that accepts connections and drops them
// at once (crash-looping, shedding load) is retried with the backoff, not in a tight loop.
//
// A connection that is down (lost, or never made) with nothing pending and no request for
// IdleConnectionTTL (10 minutes) leaves the pool: a long-running client whose bookies come and
// go under new addresses keeps no entry per address it ever used. A request on it afterwards
// (from a ledger that kept it) goes to the pool's connection to that address, or puts it back.
//
// # Backpressure and limits
//
// MaxPendingPerConn bounds the requests in flight on one connection; over it a request fails
// at once with ErrTooManyPending (the caller decides whether to wait or go elsewhere).
//
// MaxQueuedBytesPerConn bounds the encoded bytes waiting for the writer. A request that does
// not fit blocks its caller (the one place Add and Read block) until the writer takes the
// queue, the connection fails, the pool closes, or the request's own timeout passes, in which
// case it fails with ErrTimeout; a ReadContext also stops waiting when its context ends, and
// fails unsent with the context's error. Blocking is the natural backpressure of a socket slower than
// its callers; the timeout bounds it, so a caller blocked while holding a lock that a
// callback needs cannot deadlock the connection for longer than that.
//
// MaxFrameSize (nettyMaxFrameSizeBytes, length prefix included) bounds frames both ways: an
// add that would exceed it fails locally with ErrEntryTooLarge before anything is sent (an
// oversize entry must not look like a bookie failure; one within this limit but over a
// bookie's is answered EBADREQ by a ringkeeper bookie), and a response frame announcing more
// closes the connection before anything is allocated for it.
//
// # Memory
//
// Add and Read allocate nothing in steady state (a held request, see Matching, allocates its
// frame): request structs are pooled, requests are encoded into two per-connection write
// buffers that swap between the callers and the writer, and responses are decoded in place
// in one receive buffer per connection (grown to the largest frame seen, at most
// MaxFrameSize). The stored entry is copied once, into the write buffer, before Add returns;
// the contract nevertheless asks callers to keep the parts unchanged until the callback,
// which leaves room for sending large entries without the copy.
package transport

// Package server is the bookie's network server: BookKeeper's v2 protocol (package
// net/protocol) served on gnet v2 event loops for plaintext connections, and on a stdlib
// crypto/tls listener (tlsPort) with the same protocol code. It talks to storage through the
// small Storage interface, which the engine implements.
//
// # Shape
//
// The protocol side of a connection (connState: decode, dispatch, the response queue, the
// in-flight counters, auth state) is shared by both transports; a transport only decides how
// bytes come in and how queued responses go out:
//
//	                 ┌──────────── reader ─────────────┐        ┌──── writer ────┐
//	gnet (plaintext) │ event loop: OnTraffic           │        │ the same loop  │
//	TLS  (stdlib)    │ goroutine per conn: Read → buf  │        │ goroutine/conn │
//	                 └─ SplitFrame → DecodeRequest ────┘        └────────────────┘
//	                        │ (in place, no copy)                        ▲
//	                        ▼                                            │ take(): swap buffers
//	    ADD   → Storage.Add ─────── done (journal goroutine) → queueAdd ─┤
//	    READ  → Storage.ReadCached (hit: answered on the reader)         │
//	          → miss / entry -1 / fencing → read pool → Storage.Read ────┤ queueBuf
//	    BATCH → read pool ───────────────────────────────────────────────┘
//	    AUTH  → AuthSession.Step on the reader
//
// # Threading model
//
// Event loops (NumEventLoops gnet loops, multicore, TCP_NODELAY). OnTraffic decodes every
// complete frame in the inbound buffer in place (Peek, SplitFrame, DecodeRequest, Discard) and
// dispatches it; it never blocks. It calls Storage.Add (the engine copies the entry once, into
// its write cache; the slice aliases gnet's buffer only during the call), Storage.ReadCached,
// Storage.ReadOnly and AuthSession.Step, all of which must not block, and it queues reads on
// the bounded worker pool without waiting (a full queue answers ETOOMANYREQUESTS). Responses
// made on the loop (cached reads, rejections, EBADREQ, auth answers) collect in the
// connection's immediate buffer; at the end of OnTraffic they and everything queued by
// completions go out in one writev.
//
// Storage completion goroutines (the journal's callback goroutine) run completeAdd: it appends
// the 24-byte add response to the connection's queue under the connection's mutex and, only if
// the queue was empty, wakes the connection (gnet Conn.Wake, which runs OnTraffic on its loop).
// The loop swaps the queue with a spare buffer and writes everything that accumulated in one
// write: a journal group's responses to one connection usually leave in one writev
// (BookKeeper's flushPendingResponse), with no allocation per response (double buffers per
// connection, pooled add contexts, and one Wake per flush rather than one AsyncWrite per
// response). Completions never block: the mutex only guards an append.
//
// Read workers (NumReadWorkerThreads goroutines, numReadWorkerThreads) take tasks from a
// bounded channel (ReadWorkerQueueSize) and call Storage.Read, which may block on disk. A
// fencing read calls Storage.Fence and its worker waits for the fence to become durable before
// reading the requested entry (BookKeeper clients send -1, the last entry); fencing reads are
// rare (recovery), so a worker waiting on a journal fsync is acceptable. A response up to
// 4 KiB is copied into the connection's queue; a larger one is queued as its own pooled buffer
// (one iovec, no second copy).
//
// TLS connections (crypto/tls, stdlib net) have a reader goroutine running the same decode
// and dispatch code on its own receive buffer, and a writer goroutine that writes the queue
// when woken. Handshakes are bounded by TLSHandshakeTimeout; client certificates are verified
// when TLSConfig asks for them (LoadTLSConfig). With PlaintextRefused (a bookie requiring
// client certificates) the plaintext port answers every add and read EUA and closes on AUTH;
// so does a TLS connection whose certificate AuthorizeCertificate refuses (authorizedRoles).
//
// A resume goroutine wakes paused connections, and connections whose socket has not taken all
// that gnet holds for them, every ResumeInterval (see below); it runs only while there are any.
//
// # Limits and backpressure
//
// In flight (counted from dispatch to the response being queued):
//   - MaxPendingAddRequestsPerThread and MaxPendingReadRequestsPerThread (default 10000) bound
//     one connection's adds and pool reads. BookKeeper applies these per worker thread; an
//     event-loop server has no add threads, so they apply per connection here.
//   - MaxAddsInProgressLimit and MaxReadsInProgressLimit bound all connections (0 = unlimited).
//     A read counts until its response is queued (in BookKeeper, until it is written); the
//     memory of responses not yet written is bounded by MaxUnwrittenReadBytes (below).
//   - Over any of them the request is answered ETOOMANYREQUESTS at once. (BookKeeper stops
//     reading the socket for the global limits; gnet cannot stop reading, so rejecting is the
//     bounded alternative.) Reads answered from the cache on the loop are not counted.
//
// Outbound: when a connection's response bytes not yet on the wire (our queue plus gnet's
// outbound buffer plus the immediate buffer) exceed MaxOutboundBytesPerConnection (16 MiB),
// its reader stops decoding: the connection is paused. Read workers answer ETOOMANYREQUESTS
// instead of reading for a connection over the limit, and queue a response they read only if
// the connection's backlog stays within the limit (or is empty): checked under the queue's
// lock, so workers reading for one connection at once cannot take it past together (a check
// before reading only would let each of them add a whole frame). A response made on the reader
// (a cached read) can pass the limit by one response; in-flight adds add 24 bytes each. The
// backlog the workers see counts what gnet held after the last write until the loop learns
// what the socket took, so it may overstate but never understate it.
//
// Read response memory: MaxUnwrittenReadBytes (maxUnwrittenReadBytes, 128 MiB) bounds the
// bytes of read responses, over all connections, that have been read (by a worker, or from
// the cache on the loop) and not yet taken by a socket: queued, in gnet's outbound buffer, or
// in a TLS write in progress. A response that does not fit is answered ETOOMANYREQUESTS, as
// over MaxReadsInProgressLimit (but for a fencing read's, which is read after its fence is
// durable); nothing waits for room, so a slow reader holds up no event loop or worker. The per-connection limit alone would let memory grow with the number of
// slow connections. A connection whose transport still holds read bytes its socket did not
// take (a slow reader) is admitted only within half of the budget, so that slow readers
// cannot take it all from clients that keep up (a new connection is not known to be slow
// until its first response stalls). gnet drains its buffer without telling, so a plaintext
// connection in which gnet holds bytes is woken every ResumeInterval, as a paused one is, to
// learn what the socket took; the bytes gnet holds count as read bytes up to the read bytes
// written (an over-estimate when add responses are mixed in). Cached reads are added to the
// total when the loop writes them (once per batch, not per read), so the batches the loops
// are decoding, up to about 256 KiB and one response each, can pass it.
//
// Inbound: gnet has no read-side backpressure (it always reads the socket into the
// connection's inbound buffer), so a paused connection keeps accumulating request bytes. When
// they exceed MaxInboundBytesPerConnection (16 MiB, at least MaxFrameSize) the connection is
// closed: a client that sends but never reads is disconnected rather than allowed to grow the
// bookie's memory. A plaintext connection therefore holds at most about
// MaxInboundBytesPerConnection + ReadBufferCap + MaxOutboundBytesPerConnection + the in-flight
// responses. On the TLS path the reader simply stops reading while paused and TCP pushes back,
// so nothing is closed there.
//
// Frames: a frame announcing more than MaxFrameSize (nettyMaxFrameSizeBytes, 5 MiB, prefix
// included) is never buffered. An add (on an authenticated connection, where authentication
// is on) is answered EBADREQ once its ids have arrived, and its remaining bytes are discarded
// as they come; the connection goes on. Netty instead closes the connection, which fails every
// request in flight on it, of every ledger, and clients whose own limit is larger take that
// for a bookie failure and change ensembles across the cluster (BookKeeper #2357); this
// client fails the ledger with ErrEntryTooLarge on EBADREQ instead. The discard is bounded:
// a frame announcing more than maxDiscardFrames (8) × MaxFrameSize closes the connection as
// soon as its length prefix has arrived, since so large a claim is not a client whose limit
// is merely larger than ours, and waiting out up to 2 GiB of it would tie the connection up
// for nothing. Any other oversize frame closes the connection once its header has arrived,
// before anything is allocated for it. ReadBufferCap (default MaxFrameSize, rounded up by
// gnet to a power of two) is gnet's per-loop read buffer, so one read can take a whole frame.
//
// # Bad input and failures
//
// A frame the codec cannot decode is answered (EBADREQ or EBADVERSION, protocol.ActionRespond)
// or closes the connection (ActionClose: unknown opcode, frame too short to address a
// response, malformed AUTH). Closing one connection never affects another.
//
// Authentication (Config.Auth): as BookKeeper's AuthHandler for v2 clients, until a connection
// has authenticated its adds, reads and batch reads get EUA; an AUTH naming another plugin, or
// one the session rejects, closes the connection; without a provider an AUTH closes the
// connection. TokenAuth is a shared-token provider (constant-time comparison).
//
// Panics: a panic while handling a request (in our code or in a Storage method called on the
// reader, a read worker or a blocking-add worker) is recovered, logged with its stack at error
// level, counted (Stats.Panics, ringkeeper_server_connections_closed_total{reason="panic"}),
// and closes that connection only; the process goes on serving the others. This is
// containment, not correctness: a panic is a bug. Storage completion callbacks run on the
// storage's goroutines and are not wrapped.
//
// # Shutdown
//
// Stop stops accepting (new plaintext connections are closed on open, the TLS listener is
// closed), stops decoding requests, waits (bounded by its context) until in-flight adds and
// reads are answered and their responses handed to the sockets, then closes every connection
// (gnet writes what it has buffered, best effort), and stops the workers.
//
// # gnet notes
//
//   - Engine.Stop polls every 500 ms; Stop triggers it with a canceled context and waits for
//     gnet.Run to return instead.
//   - With ReusePort each event loop binds its own listener to the configured address, so port
//     0 would give each loop a different port: the server picks a free port first.
//   - Writev hands its slices to writev(2) unchanged, and more than IOV_MAX (1024) fails the
//     write and closes the connection, so flushes are split into groups of at most 512.
//   - Conn.Wake after the engine has closed its poller would write to a closed eventfd number;
//     wakes are issued only under the connection's mutex while the connection is open, and gnet
//     closes (OnClose) every connection before it closes its pollers.
//   - gnet's logger is process-global (the last engine started sets it); it is routed to slog.
package server

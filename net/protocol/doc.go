// Package protocol is BookKeeper's v2 binary wire protocol ("pre-v3", BookieProtocol and
// BookieProtoEncoding in BookKeeper), byte for byte, as a pure codec: no sockets, no
// goroutines. A server splits frames off its inbound bytes with SplitFrame, decodes them in
// place with DecodeRequest and appends responses to one outbound buffer with the AppendX
// functions; a client does the reverse with the request encoders and DecodeResponse.
//
// All integers are big-endian. Wire format: do not change.
//
// # Framing
//
//	+----------------+------------------------+
//	| frameLen int32 | frame (frameLen bytes) |
//	+----------------+------------------------+
//
// frameLen must be ≥ 4 (MinFrameLength, the packet header); negative or smaller lengths are
// ErrBadFrame. As with Netty's LengthFieldBasedFrameDecoder, the maximum (nettyMaxFrameSizeBytes,
// DefaultMaxFrameSize = 5 MiB) counts the 4-byte prefix too: frameLen + 4 > max is
// ErrFrameTooLarge, decided from the first 4 bytes, before anything is allocated. Either error
// ends the connection. Every message below is the frame, after frameLen.
//
// # Packet header
//
//	 31      24 23      16 15                0
//	+----------+----------+-------------------+
//	| version  |  opcode  |      flags        |
//	+----------+----------+-------------------+
//
// version 2 is current. Version 0 is the legacy header, which is only the opcode (in the low
// byte; bits 8–23 are ignored and there are no flags). Responses carry the request's version
// and flags 0. Opcodes: ADDENTRY 1, READENTRY 2, AUTH 3, READ_LAC 4, WRITE_LAC 5,
// GET_BOOKIE_INFO 6, BATCH_READ_ENTRY 7; only 1, 2, 3 and 7 travel in v2 frames. Flags:
// DO_FENCING 0x1, RECOVERY_ADD 0x2, HIGH_PRIORITY 0x4.
//
// # Add request (ADDENTRY)
//
//	 0      4                  24       32       40        48       56
//	+------+------------------+--------+--------+---------+--------+----------+---------+
//	| hdr  | masterKey[20]    |ledgerId|entryId | LAC     | length | digest[N]| payload |
//	+------+------------------+--------+--------+---------+--------+----------+---------+
//	                          \_____________________ stored entry ____________________/
//
// The stored entry is opaque to the bookie (it is what the journal and entry log store), except
// that its first 16 bytes name the ledger and entry. It must hold at least its 32-byte header.
// The digest is the client's business (N = 8 CRC32, 4 CRC32C, 20 HMAC-SHA1, 0 DUMMY).
//
// # Read request (READENTRY)
//
//	 0      4        12       20                 40
//	+------+--------+--------+------------------+
//	| hdr  |ledgerId|entryId | masterKey[20]    |   the key only if present
//	+------+--------+--------+------------------+
//
// entryId -1 asks for the last entry (the LAC is in its header). A version-2 read with DO_FENCING
// must carry the key; BookKeeper's client writes a key whenever it has one, so a key on a read
// without DO_FENCING is accepted (and ignored by the server).
//
// # Batch read request (BATCH_READ_ENTRY)
//
//	 0      4        12          20          28         32         40                 60
//	+------+--------+-----------+-----------+----------+----------+------------------+
//	| hdr  |ledgerId|startEntry | requestId | maxCount | maxSize  | masterKey[20]    |
//	+------+--------+-----------+-----------+----------+----------+------------------+
//	                                           int32      int64     only if present
//
// # AUTH request and response
//
//	+------+------------------------------------------------------------+
//	| hdr  | protobuf AuthMessage { authPluginName = 1; payload = 2 }     |
//	+------+------------------------------------------------------------+
//	        0x0A len name 0x12 len payload   (both fields required; lengths are varints)
//
// The AUTH response has the same layout: no return code. The encoder writes both fields in
// field order even when empty, as Java's protobuf does; the decoder accepts any valid protobuf
// encoding (any order, repeats, unknown fields skipped) but rejects groups.
//
// # Add and read responses
//
//	 0      4      8        16       24
//	+------+------+--------+--------+-----------------------------+
//	| hdr  | rc   |ledgerId|entryId | stored entry (reads only)   |
//	+------+------+--------+--------+-----------------------------+
//
// An add response is exactly 24 bytes. A read response carries the stored entry only when it
// succeeded; an error response is the 24 bytes alone.
//
// # Batch read response
//
//	 0      4      8        16          24          32        36              36+len0
//	+------+------+--------+-----------+-----------+---------+-------------+---------+----
//	| hdr  | rc   |ledgerId|startEntry | requestId | len0    | entry0      | len1    | ...
//	+------+------+--------+-----------+-----------+---------+-------------+---------+----
//	                                                 int32
//
// Entries repeat to the end of the frame; an error response has none.
//
// Return codes: EOK 0, ENOLEDGER 1, ENOENTRY 2, EBADREQ 100, EIO 101, EUA 102, EBADVERSION 103,
// EFENCED 104, EREADONLY 105, ETOOMANYREQUESTS 106, EUNKNOWNLEDGERSTATE 107.
//
// # Master key
//
// MasterKey(password) = SHA-1("ledger" ‖ password); an empty password gives SHA-1("ledger"),
// 850bf1071c5e3d8c24235676f8816ae0cbe2f14f. Compare keys with MasterKeyEqual (constant time)
// and never log them.
//
// # Aliasing
//
// Decoded messages alias the frame they were decoded from: AddRequest.Entry, ReadResponse.Entry,
// BatchReadResponse.Data and AuthMessage fields point into it. The caller must copy what it
// keeps before the buffer is reused (the bookie copies the stored entry once, into its write
// cache). Master keys are copied into fixed arrays. Decoding an add or read request allocates
// nothing; encoders append to a caller's buffer, so many responses can share one buffer.
//
// # Bad requests
//
// Decoding never panics. A request that cannot be decoded gives a *DecodeError whose Action
// says what to do:
//   - ActionRespond, Code EBADREQ: a malformed add, read or batch read whose ids were parsed
//     (stored entry shorter than 32 bytes; fencing read without a key; trailing bytes that are
//     not a key; a key before version 2; a truncated batch read; a negative maxCount or
//     maxSize). DecodeError.AppendResponse writes the answer.
//   - ActionRespond, Code EBADVERSION: an add, read or batch read with a version above 2 (or
//     with the top bit set), as BookKeeper's request processors answer.
//   - ActionClose: frames too short to address a response (an add shorter than key + ids, a
//     read shorter than its ids, a batch read shorter than its request id), unknown opcodes
//     (including READ_LAC, WRITE_LAC and GET_BOOKIE_INFO), and malformed AUTH messages. A v2
//     client cannot route a response it did not ask for, and BookKeeper closes too.
//
// Where this differs from BookKeeper (whose decoder throws and closes the connection on every
// decoding error, and ignores bytes after the fields it reads): we answer EBADREQ where the
// response can be addressed, we reject trailing bytes after a read or batch read other than a
// master key, and we reject negative batch-read limits that BookKeeper would treat as "no
// limit" (maxCount 0 still means no count limit).
package protocol

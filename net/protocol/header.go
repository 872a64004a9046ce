package protocol

import "strconv"

// Wire-format constants. Part of the wire format: do not change.
const (
	// LengthPrefixSize is the size of the int32 frame length that precedes every frame.
	LengthPrefixSize = 4
	// HeaderSize is the size of the packet header int32 that starts every frame.
	HeaderSize = 4
	// MinFrameLength is the smallest valid value of the length prefix: a frame holds at least
	// the packet header.
	MinFrameLength = HeaderSize
	// DefaultMaxFrameSize is BookKeeper's nettyMaxFrameSizeBytes default (5 MiB). Like Netty's
	// LengthFieldBasedFrameDecoder, the limit counts the 4-byte length prefix too.
	DefaultMaxFrameSize = 5 * 1024 * 1024
	// MasterKeyLength is the length of a master key: a SHA-1 digest.
	MasterKeyLength = 20
	// StoredEntryHeaderSize is the size of the stored entry's header: ledgerId, entryId,
	// lastAddConfirmed and length, four int64s.
	StoredEntryHeaderSize = 32
	// ResponseHeaderSize is the size of an add, read or batch-read response before its
	// payload: packet header, rc int32, ledgerId int64, entryId int64.
	ResponseHeaderSize = HeaderSize + 4 + 8 + 8

	// CurrentVersion is the protocol version this package writes (BookieProtocol's
	// CURRENT_PROTOCOL_VERSION).
	CurrentVersion uint8 = 2
	// LowestCompatVersion is the lowest version a bookie accepts.
	LowestCompatVersion uint8 = 0

	// LastAddConfirmedEntryID, as the entry id of a read, asks for the last entry the bookie
	// holds (whose header carries the ledger's last add confirmed).
	LastAddConfirmedEntryID int64 = -1
	// InvalidEntryID is used where no entry id applies.
	InvalidEntryID int64 = -1
)

// OpCode is the operation of a v2 packet.
type OpCode uint8

// Opcodes. The v2 decoder accepts OpAddEntry, OpReadEntry, OpAuth and OpBatchReadEntry;
// OpReadLAC, OpWriteLAC and OpGetBookieInfo exist only in the v3 protocol.
const (
	OpAddEntry       OpCode = 1
	OpReadEntry      OpCode = 2
	OpAuth           OpCode = 3
	OpReadLAC        OpCode = 4
	OpWriteLAC       OpCode = 5
	OpGetBookieInfo  OpCode = 6
	OpBatchReadEntry OpCode = 7
)

func (o OpCode) String() string {
	switch o {
	case OpAddEntry:
		return "ADDENTRY"
	case OpReadEntry:
		return "READENTRY"
	case OpAuth:
		return "AUTH"
	case OpReadLAC:
		return "READ_LAC"
	case OpWriteLAC:
		return "WRITE_LAC"
	case OpGetBookieInfo:
		return "GET_BOOKIE_INFO"
	case OpBatchReadEntry:
		return "BATCH_READ_ENTRY"
	}
	return "OP(" + strconv.Itoa(int(o)) + ")"
}

// Flags are the low 16 bits of a version ≥ 1 packet header.
type Flags uint16

// Request flags.
const (
	FlagNone         Flags = 0
	FlagDoFencing    Flags = 0x1
	FlagRecoveryAdd  Flags = 0x2
	FlagHighPriority Flags = 0x4
)

// Has reports whether every bit of f2 is set in f.
func (f Flags) Has(f2 Flags) bool { return f&f2 == f2 }

// ReturnCode is the rc int32 of a v2 response.
type ReturnCode int32

// Return codes of the v2 protocol.
const (
	EOK                 ReturnCode = 0
	ENOLEDGER           ReturnCode = 1
	ENOENTRY            ReturnCode = 2
	EBADREQ             ReturnCode = 100
	EIO                 ReturnCode = 101
	EUA                 ReturnCode = 102
	EBADVERSION         ReturnCode = 103
	EFENCED             ReturnCode = 104
	EREADONLY           ReturnCode = 105
	ETOOMANYREQUESTS    ReturnCode = 106
	EUNKNOWNLEDGERSTATE ReturnCode = 107
)

func (rc ReturnCode) String() string {
	switch rc {
	case EOK:
		return "EOK"
	case ENOLEDGER:
		return "ENOLEDGER"
	case ENOENTRY:
		return "ENOENTRY"
	case EBADREQ:
		return "EBADREQ"
	case EIO:
		return "EIO"
	case EUA:
		return "EUA"
	case EBADVERSION:
		return "EBADVERSION"
	case EFENCED:
		return "EFENCED"
	case EREADONLY:
		return "EREADONLY"
	case ETOOMANYREQUESTS:
		return "ETOOMANYREQUESTS"
	case EUNKNOWNLEDGERSTATE:
		return "EUNKNOWNLEDGERSTATE"
	}
	return "RC(" + strconv.Itoa(int(rc)) + ")"
}

// Header is the decoded packet header int32: version<<24 | opcode<<16 | flags.
//
// Version 0 is the legacy header, which is just the opcode: ParseHeader takes the opcode from
// the low byte and reports no flags (bits 8–23 are ignored, as BookKeeper does), and Uint32
// writes only the opcode, dropping Flags.
type Header struct {
	Version uint8
	Op      OpCode
	Flags   Flags
}

// ParseHeader splits a packet header int32.
func ParseHeader(v uint32) Header {
	version := uint8(v >> 24)
	if version == 0 {
		return Header{Op: OpCode(uint8(v))}
	}
	return Header{Version: version, Op: OpCode(uint8(v >> 16)), Flags: Flags(uint16(v))}
}

// Uint32 is the header as it goes on the wire.
func (h Header) Uint32() uint32 {
	if h.Version == 0 {
		return uint32(h.Op)
	}
	return uint32(h.Version)<<24 | uint32(h.Op)<<16 | uint32(h.Flags)
}

// Compatible reports whether a bookie serves requests of this version
// (LowestCompatVersion ≤ Version ≤ CurrentVersion). Versions with the top bit set are negative
// in BookKeeper's signed byte and are incompatible too.
func (h Header) Compatible() bool { return h.Version <= CurrentVersion }

//go:build linux

package iouring

import (
	"strconv"
	"unsafe"
)

// This file mirrors the kernel ABI (include/uapi/linux/io_uring.h). The layouts are part of
// the kernel ABI and must not be changed; their sizes are checked at compile time below and
// field offsets in abi_test.go.

// Opcode is an SQE operation (enum io_uring_op).
type Opcode uint8

// Opcodes this package knows by name. Others can be used through SQE.PrepRW.
const (
	OpNop            Opcode = 0  // IORING_OP_NOP
	OpReadv          Opcode = 1  // IORING_OP_READV
	OpWritev         Opcode = 2  // IORING_OP_WRITEV
	OpFsync          Opcode = 3  // IORING_OP_FSYNC
	OpReadFixed      Opcode = 4  // IORING_OP_READ_FIXED
	OpWriteFixed     Opcode = 5  // IORING_OP_WRITE_FIXED
	OpPollAdd        Opcode = 6  // IORING_OP_POLL_ADD
	OpPollRemove     Opcode = 7  // IORING_OP_POLL_REMOVE
	OpSyncFileRange  Opcode = 8  // IORING_OP_SYNC_FILE_RANGE
	OpSendmsg        Opcode = 9  // IORING_OP_SENDMSG
	OpRecvmsg        Opcode = 10 // IORING_OP_RECVMSG
	OpTimeout        Opcode = 11 // IORING_OP_TIMEOUT
	OpTimeoutRemove  Opcode = 12 // IORING_OP_TIMEOUT_REMOVE
	OpAccept         Opcode = 13 // IORING_OP_ACCEPT
	OpAsyncCancel    Opcode = 14 // IORING_OP_ASYNC_CANCEL
	OpLinkTimeout    Opcode = 15 // IORING_OP_LINK_TIMEOUT
	OpConnect        Opcode = 16 // IORING_OP_CONNECT
	OpFallocate      Opcode = 17 // IORING_OP_FALLOCATE
	OpOpenat         Opcode = 18 // IORING_OP_OPENAT
	OpClose          Opcode = 19 // IORING_OP_CLOSE
	OpFilesUpdate    Opcode = 20 // IORING_OP_FILES_UPDATE
	OpStatx          Opcode = 21 // IORING_OP_STATX
	OpRead           Opcode = 22 // IORING_OP_READ
	OpWrite          Opcode = 23 // IORING_OP_WRITE
	OpFadvise        Opcode = 24 // IORING_OP_FADVISE
	OpMadvise        Opcode = 25 // IORING_OP_MADVISE
	OpSend           Opcode = 26 // IORING_OP_SEND
	OpRecv           Opcode = 27 // IORING_OP_RECV
	OpOpenat2        Opcode = 28 // IORING_OP_OPENAT2
	OpEpollCtl       Opcode = 29 // IORING_OP_EPOLL_CTL
	OpSplice         Opcode = 30 // IORING_OP_SPLICE
	OpProvideBuffers Opcode = 31 // IORING_OP_PROVIDE_BUFFERS
	OpRemoveBuffers  Opcode = 32 // IORING_OP_REMOVE_BUFFERS
	OpTee            Opcode = 33 // IORING_OP_TEE
	OpShutdown       Opcode = 34 // IORING_OP_SHUTDOWN
	OpRenameat       Opcode = 35 // IORING_OP_RENAMEAT
	OpUnlinkat       Opcode = 36 // IORING_OP_UNLINKAT
	OpMkdirat        Opcode = 37 // IORING_OP_MKDIRAT
	OpSymlinkat      Opcode = 38 // IORING_OP_SYMLINKAT
	OpLinkat         Opcode = 39 // IORING_OP_LINKAT
	OpMsgRing        Opcode = 40 // IORING_OP_MSG_RING
)

var opNames = [...]string{
	"NOP", "READV", "WRITEV", "FSYNC", "READ_FIXED", "WRITE_FIXED", "POLL_ADD", "POLL_REMOVE",
	"SYNC_FILE_RANGE", "SENDMSG", "RECVMSG", "TIMEOUT", "TIMEOUT_REMOVE", "ACCEPT",
	"ASYNC_CANCEL", "LINK_TIMEOUT", "CONNECT", "FALLOCATE", "OPENAT", "CLOSE", "FILES_UPDATE",
	"STATX", "READ", "WRITE", "FADVISE", "MADVISE", "SEND", "RECV", "OPENAT2", "EPOLL_CTL",
	"SPLICE", "PROVIDE_BUFFERS", "REMOVE_BUFFERS", "TEE", "SHUTDOWN", "RENAMEAT", "UNLINKAT",
	"MKDIRAT", "SYMLINKAT", "LINKAT", "MSG_RING",
}

// String returns the kernel's name without the IORING_OP_ prefix, or "OP(n)".
func (o Opcode) String() string {
	if int(o) < len(opNames) {
		return opNames[o]
	}
	return "OP(" + strconv.Itoa(int(o)) + ")"
}

// SQEFlag is a per-SQE flag (IOSQE_*), set with SQE.SetFlags.
type SQEFlag uint8

const (
	// SQEFixedFile (IOSQE_FIXED_FILE): fd is an index into the registered file table.
	SQEFixedFile SQEFlag = 1 << 0
	// SQEIODrain (IOSQE_IO_DRAIN): start this SQE only after every earlier SQE has completed.
	SQEIODrain SQEFlag = 1 << 1
	// SQEIOLink (IOSQE_IO_LINK): the next SQE starts only after this one completes
	// successfully; if this one fails (or a write is short), the rest of the chain completes
	// with -ECANCELED.
	SQEIOLink SQEFlag = 1 << 2
	// SQEIOHardlink (IOSQE_IO_HARDLINK): like SQEIOLink, but the chain continues on failure.
	SQEIOHardlink SQEFlag = 1 << 3
	// SQEAsync (IOSQE_ASYNC): always punt to the kernel's async workers.
	SQEAsync SQEFlag = 1 << 4
	// SQEBufferSelect (IOSQE_BUFFER_SELECT): pick a buffer from a provided-buffer group.
	SQEBufferSelect SQEFlag = 1 << 5
	// SQECQESkipSuccess (IOSQE_CQE_SKIP_SUCCESS): post no CQE when the op succeeds.
	SQECQESkipSuccess SQEFlag = 1 << 6
)

// SetupFlag is an io_uring_setup flag (IORING_SETUP_*).
type SetupFlag uint32

const (
	SetupIOPoll       SetupFlag = 1 << 0  // IORING_SETUP_IOPOLL
	SetupSQPoll       SetupFlag = 1 << 1  // IORING_SETUP_SQPOLL
	SetupSQAff        SetupFlag = 1 << 2  // IORING_SETUP_SQ_AFF
	SetupCQSize       SetupFlag = 1 << 3  // IORING_SETUP_CQSIZE
	SetupClamp        SetupFlag = 1 << 4  // IORING_SETUP_CLAMP
	SetupAttachWQ     SetupFlag = 1 << 5  // IORING_SETUP_ATTACH_WQ
	SetupRDisabled    SetupFlag = 1 << 6  // IORING_SETUP_R_DISABLED
	SetupSubmitAll    SetupFlag = 1 << 7  // IORING_SETUP_SUBMIT_ALL
	SetupCoopTaskrun  SetupFlag = 1 << 8  // IORING_SETUP_COOP_TASKRUN
	SetupTaskrunFlag  SetupFlag = 1 << 9  // IORING_SETUP_TASKRUN_FLAG
	SetupSQE128       SetupFlag = 1 << 10 // IORING_SETUP_SQE128
	SetupCQE32        SetupFlag = 1 << 11 // IORING_SETUP_CQE32
	SetupSingleIssuer SetupFlag = 1 << 12 // IORING_SETUP_SINGLE_ISSUER
	SetupDeferTaskrun SetupFlag = 1 << 13 // IORING_SETUP_DEFER_TASKRUN
)

// Feature is a bit of io_uring_params.features (IORING_FEAT_*), reported by Ring.Features.
type Feature uint32

const (
	FeatSingleMmap     Feature = 1 << 0  // IORING_FEAT_SINGLE_MMAP
	FeatNoDrop         Feature = 1 << 1  // IORING_FEAT_NODROP
	FeatSubmitStable   Feature = 1 << 2  // IORING_FEAT_SUBMIT_STABLE
	FeatRWCurPos       Feature = 1 << 3  // IORING_FEAT_RW_CUR_POS
	FeatCurPersonality Feature = 1 << 4  // IORING_FEAT_CUR_PERSONALITY
	FeatFastPoll       Feature = 1 << 5  // IORING_FEAT_FAST_POLL
	FeatPoll32Bits     Feature = 1 << 6  // IORING_FEAT_POLL_32BITS
	FeatSQPollNonfixed Feature = 1 << 7  // IORING_FEAT_SQPOLL_NONFIXED
	FeatExtArg         Feature = 1 << 8  // IORING_FEAT_EXT_ARG
	FeatNativeWorkers  Feature = 1 << 9  // IORING_FEAT_NATIVE_WORKERS
	FeatRsrcTags       Feature = 1 << 10 // IORING_FEAT_RSRC_TAGS
	FeatCQESkip        Feature = 1 << 11 // IORING_FEAT_CQE_SKIP
	FeatLinkedFile     Feature = 1 << 12 // IORING_FEAT_LINKED_FILE
	FeatRegRegRing     Feature = 1 << 13 // IORING_FEAT_REG_REG_RING
)

// Has reports whether every bit of want is set in f.
func (f Feature) Has(want Feature) bool { return f&want == want }

// FsyncDatasync (IORING_FSYNC_DATASYNC) makes OpFsync behave like fdatasync(2).
const FsyncDatasync uint32 = 1 << 0

// CQE flags (IORING_CQE_F_*).
const (
	CQEFBuffer       uint32 = 1 << 0 // IORING_CQE_F_BUFFER
	CQEFMore         uint32 = 1 << 1 // IORING_CQE_F_MORE
	CQEFSockNonempty uint32 = 1 << 2 // IORING_CQE_F_SOCK_NONEMPTY
	CQEFNotif        uint32 = 1 << 3 // IORING_CQE_F_NOTIF
)

// mmap offsets.
const (
	offSQRing int64 = 0          // IORING_OFF_SQ_RING
	offCQRing int64 = 0x8000000  // IORING_OFF_CQ_RING
	offSQEs   int64 = 0x10000000 // IORING_OFF_SQES
)

// sq_flags bits the kernel sets in the shared SQ ring.
const (
	sqCQOverflow uint32 = 1 << 1 // IORING_SQ_CQ_OVERFLOW
	sqTaskrun    uint32 = 1 << 2 // IORING_SQ_TASKRUN
)

// io_uring_enter flags.
const (
	enterGetEvents uint32 = 1 << 0 // IORING_ENTER_GETEVENTS
)

// io_uring_register opcodes.
const (
	registerBuffers   uintptr = 0 // IORING_REGISTER_BUFFERS
	unregisterBuffers uintptr = 1 // IORING_UNREGISTER_BUFFERS
	registerEventFD   uintptr = 4 // IORING_REGISTER_EVENTFD
	registerProbe     uintptr = 8 // IORING_REGISTER_PROBE
)

// Kernel limits.
const (
	maxEntries       = 32768   // IORING_MAX_ENTRIES
	maxCQEntries     = 65536   // IORING_MAX_CQ_ENTRIES
	maxRegBuffers    = 1 << 14 // IORING_MAX_REG_BUFFERS
	maxRegBufferSize = 1 << 30 // SZ_1G, per registered buffer
	probeOpsMax      = 256
	opSupported      = 1 << 0 // IO_URING_OP_SUPPORTED
)

// SQE is one submission queue entry (struct io_uring_sqe, 64 bytes). SQEs live in memory
// shared with the kernel and are reused: get one with Ring.GetSQE, fill it with one Prep
// method (which zeroes it first), then optionally SetUserData and SetFlags.
type SQE struct {
	opcode      Opcode  // 0
	flags       SQEFlag // 1
	ioprio      uint16  // 2
	fd          int32   // 4
	off         uint64  // 8: off / addr2
	addr        uint64  // 16: addr / splice_off_in
	len         uint32  // 24
	opFlags     uint32  // 28: rw_flags, fsync_flags, ...
	userData    uint64  // 32
	bufIndex    uint16  // 40: buf_index / buf_group
	personality uint16  // 42
	spliceFdIn  int32   // 44: splice_fd_in / file_index
	addr3       uint64  // 48
	pad2        uint64  // 56
}

// CQE is one completion queue entry (struct io_uring_cqe, 16 bytes).
type CQE struct {
	// UserData is copied from the SQE that produced this completion.
	UserData uint64
	// Res is the operation's result: a byte count or 0 on success, -errno on failure.
	Res int32
	// Flags holds IORING_CQE_F_* bits.
	Flags uint32
}

// sqringOffsets is struct io_sqring_offsets.
type sqringOffsets struct {
	head, tail, ringMask, ringEntries, flags, dropped, array, resv1 uint32
	userAddr                                                        uint64
}

// cqringOffsets is struct io_cqring_offsets.
type cqringOffsets struct {
	head, tail, ringMask, ringEntries, overflow, cqes, flags, resv1 uint32
	userAddr                                                        uint64
}

// Params is struct io_uring_params (120 bytes), filled in by io_uring_setup.
type Params struct {
	SQEntries    uint32
	CQEntries    uint32
	Flags        SetupFlag
	SQThreadCPU  uint32
	SQThreadIdle uint32
	Features     Feature
	WQFd         uint32
	resv         [3]uint32
	sqOff        sqringOffsets
	cqOff        cqringOffsets
}

// probeHeader is struct io_uring_probe without its flexible ops array.
type probeHeader struct {
	lastOp uint8
	opsLen uint8
	resv   uint16
	resv2  [3]uint32
}

// probeOp is struct io_uring_probe_op.
type probeOp struct {
	op    uint8
	resv  uint8
	flags uint16
	resv2 uint32
}

// probeBuf is struct io_uring_probe with room for every possible opcode.
type probeBuf struct {
	probeHeader
	ops [probeOpsMax]probeOp
}

// Compile-time size checks: each array length underflows (a compile error) unless the
// size matches the kernel's exactly.
var (
	_ [unsafe.Sizeof(SQE{}) - 64]byte
	_ [64 - unsafe.Sizeof(SQE{})]byte
	_ [unsafe.Sizeof(CQE{}) - 16]byte
	_ [16 - unsafe.Sizeof(CQE{})]byte
	_ [unsafe.Sizeof(Params{}) - 120]byte
	_ [120 - unsafe.Sizeof(Params{})]byte
	_ [unsafe.Sizeof(probeHeader{}) - 16]byte
	_ [16 - unsafe.Sizeof(probeHeader{})]byte
	_ [unsafe.Sizeof(probeOp{}) - 8]byte
	_ [8 - unsafe.Sizeof(probeOp{})]byte
)

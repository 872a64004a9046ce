package metadata

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"slices"
	"time"
)

// Codec turns ledger metadata into the bytes a driver stores, and back.
//
// It is the seam for a codec compatible with BookKeeper's
// LedgerMetadataFormat v3 (a text header plus a length-delimited protobuf);
// drivers take their codec from Options.Codec.
type Codec interface {
	// Encode validates md and encodes it. It does not retain md.
	Encode(md *LedgerMetadata) ([]byte, error)
	// Decode decodes and validates data. It never panics; errors wrap
	// ErrCorruptMetadata or ErrUnsupportedFormat. The result does not alias
	// data.
	Decode(data []byte) (*LedgerMetadata, error)
}

// BinaryCodec is ringkeeper's own format, drawn in the package documentation.
type BinaryCodec struct{}

// DefaultCodec is the codec drivers use when Options.Codec is nil.
var DefaultCodec Codec = BinaryCodec{}

// Format constants; part of the stored format, never change them.
const (
	binaryMagic      = "RKLM"
	binaryVersion    = 1
	binaryHeaderLen  = 4 + 2 + 4 // magic, version, body length
	binaryTrailerLen = 4         // CRC32C
	// bookKeeperHeader starts BookKeeper's LedgerMetadataFormat (v2, v3).
	bookKeeperHeader = "BookieMetadataFormatVersion\t"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// EncodeLedgerMetadata encodes md with DefaultCodec.
func EncodeLedgerMetadata(md *LedgerMetadata) ([]byte, error) { return DefaultCodec.Encode(md) }

// DecodeLedgerMetadata decodes data with DefaultCodec.
func DecodeLedgerMetadata(data []byte) (*LedgerMetadata, error) { return DefaultCodec.Decode(data) }

// Encode implements Codec.
func (BinaryCodec) Encode(md *LedgerMetadata) ([]byte, error) {
	if err := md.Validate(); err != nil {
		return nil, err
	}
	var ctime int64
	if !md.CreationTime.IsZero() {
		ctime = md.CreationTime.UnixMilli()
	}
	b := make([]byte, binaryHeaderLen, 128)
	copy(b, binaryMagic)
	binary.BigEndian.PutUint16(b[4:], binaryVersion)
	b = append(b, byte(md.State), byte(md.DigestType))
	b = binary.BigEndian.AppendUint16(b, uint16(md.EnsembleSize))
	b = binary.BigEndian.AppendUint16(b, uint16(md.WriteQuorumSize))
	b = binary.BigEndian.AppendUint16(b, uint16(md.AckQuorumSize))
	b = binary.BigEndian.AppendUint64(b, uint64(md.LastEntryID))
	b = binary.BigEndian.AppendUint64(b, uint64(md.Length))
	b = binary.BigEndian.AppendUint64(b, uint64(ctime))
	b = binary.BigEndian.AppendUint16(b, uint16(len(md.Password)))
	b = append(b, md.Password...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(md.Ensembles)))
	for _, e := range md.Ensembles {
		b = binary.BigEndian.AppendUint64(b, uint64(e.FirstEntryID))
		for _, id := range e.Bookies {
			b = binary.BigEndian.AppendUint16(b, uint16(len(id)))
			b = append(b, id...)
		}
	}
	keys := make([]string, 0, len(md.CustomMetadata))
	for k := range md.CustomMetadata {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	b = binary.BigEndian.AppendUint32(b, uint32(len(keys)))
	for _, k := range keys {
		v := md.CustomMetadata[k]
		if len(v) > MaxEncodedSize {
			return nil, fmt.Errorf("%w: custom metadata %q of %d bytes", ErrInvalidMetadata, k, len(v))
		}
		b = binary.BigEndian.AppendUint16(b, uint16(len(k)))
		b = append(b, k...)
		b = binary.BigEndian.AppendUint32(b, uint32(len(v)))
		b = append(b, v...)
	}
	if len(b)+binaryTrailerLen > MaxEncodedSize {
		return nil, fmt.Errorf("%w: encodes to %d bytes, limit %d", ErrInvalidMetadata, len(b)+binaryTrailerLen, MaxEncodedSize)
	}
	binary.BigEndian.PutUint32(b[6:], uint32(len(b)-binaryHeaderLen))
	return binary.BigEndian.AppendUint32(b, crcOf(b)), nil
}

// Decode implements Codec.
func (BinaryCodec) Decode(data []byte) (*LedgerMetadata, error) {
	if bytes.HasPrefix(data, []byte(bookKeeperHeader)) {
		line, _, _ := bytes.Cut(data, []byte("\n"))
		return nil, fmt.Errorf("%w: BookKeeper LedgerMetadataFormat (%q) needs a BookKeeper codec", ErrUnsupportedFormat, line)
	}
	if len(data) < binaryHeaderLen+binaryTrailerLen {
		return nil, fmt.Errorf("%w: %d bytes is shorter than header and checksum", ErrCorruptMetadata, len(data))
	}
	if string(data[:4]) != binaryMagic {
		return nil, fmt.Errorf("%w: bad magic %q", ErrCorruptMetadata, data[:4])
	}
	if v := binary.BigEndian.Uint16(data[4:]); v != binaryVersion {
		return nil, fmt.Errorf("%w: format version %d (this build reads %d)", ErrUnsupportedFormat, v, binaryVersion)
	}
	bodyLen := binary.BigEndian.Uint32(data[6:])
	if uint64(bodyLen) != uint64(len(data)-binaryHeaderLen-binaryTrailerLen) {
		return nil, fmt.Errorf("%w: body length %d, but %d bytes follow the header", ErrCorruptMetadata,
			bodyLen, len(data)-binaryHeaderLen-binaryTrailerLen)
	}
	end := len(data) - binaryTrailerLen
	if want, got := binary.BigEndian.Uint32(data[end:]), crcOf(data[:end]); want != got {
		return nil, fmt.Errorf("%w: checksum mismatch (stored %08x, computed %08x)", ErrCorruptMetadata, want, got)
	}
	d := decoder{buf: data[binaryHeaderLen:end]}
	md := d.metadata()
	if d.err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCorruptMetadata, d.err)
	}
	if len(d.buf) != 0 {
		return nil, fmt.Errorf("%w: %d trailing bytes in body", ErrCorruptMetadata, len(d.buf))
	}
	if err := md.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCorruptMetadata, err)
	}
	return md, nil
}

// decoder reads big-endian fields; after the first error every read returns
// zero values and err keeps that first error.
type decoder struct {
	buf []byte
	err error
}

func (d *decoder) take(n int, what string) []byte {
	if d.err != nil {
		return nil
	}
	if n < 0 || n > len(d.buf) {
		d.err = fmt.Errorf("truncated %s: need %d bytes, have %d", what, n, len(d.buf))
		return nil
	}
	b := d.buf[:n:n]
	d.buf = d.buf[n:]
	return b
}

func (d *decoder) u8(what string) uint8 {
	if b := d.take(1, what); b != nil {
		return b[0]
	}
	return 0
}

func (d *decoder) u16(what string) uint16 {
	if b := d.take(2, what); b != nil {
		return binary.BigEndian.Uint16(b)
	}
	return 0
}

func (d *decoder) u32(what string) uint32 {
	if b := d.take(4, what); b != nil {
		return binary.BigEndian.Uint32(b)
	}
	return 0
}

func (d *decoder) i64(what string) int64 {
	if b := d.take(8, what); b != nil {
		return int64(binary.BigEndian.Uint64(b))
	}
	return 0
}

// count reads a u32 element count and checks that count elements of at least
// minSize bytes each can fit in what is left, so that a corrupt count cannot
// make the decoder allocate more than the input's size.
func (d *decoder) count(minSize int, what string) int {
	n := d.u32(what + " count")
	if d.err == nil && uint64(n)*uint64(minSize) > uint64(len(d.buf)) {
		d.err = fmt.Errorf("%s count %d does not fit in %d bytes", what, n, len(d.buf))
		return 0
	}
	return int(n)
}

func (d *decoder) metadata() *LedgerMetadata {
	md := &LedgerMetadata{
		State:           LedgerState(d.u8("state")),
		DigestType:      DigestType(d.u8("digest type")),
		EnsembleSize:    int(d.u16("ensemble size")),
		WriteQuorumSize: int(d.u16("write quorum")),
		AckQuorumSize:   int(d.u16("ack quorum")),
		LastEntryID:     d.i64("last entry id"),
		Length:          d.i64("length"),
	}
	if ms := d.i64("creation time"); ms != 0 {
		md.CreationTime = time.UnixMilli(ms).UTC()
	}
	if pw := d.take(int(d.u16("password length")), "password"); len(pw) > 0 {
		md.Password = bytes.Clone(pw)
	}
	// Each segment is at least 8 bytes plus 2 per bookie.
	nseg := d.count(8+2*md.EnsembleSize, "ensemble")
	if d.err == nil {
		md.Ensembles = make([]Ensemble, 0, nseg)
	}
	for i := 0; i < nseg && d.err == nil; i++ {
		e := Ensemble{FirstEntryID: d.i64("first entry id"), Bookies: make([]string, 0, md.EnsembleSize)}
		for j := 0; j < md.EnsembleSize && d.err == nil; j++ {
			e.Bookies = append(e.Bookies, string(d.take(int(d.u16("bookie id length")), "bookie id")))
		}
		md.Ensembles = append(md.Ensembles, e)
	}
	ncustom := d.count(2+4, "custom metadata")
	if d.err == nil && ncustom > 0 {
		md.CustomMetadata = make(map[string][]byte, ncustom)
	}
	prev := ""
	for i := 0; i < ncustom && d.err == nil; i++ {
		k := string(d.take(int(d.u16("custom key length")), "custom key"))
		v := d.take(int(d.u32("custom value length")), "custom value")
		if d.err == nil && i > 0 && k <= prev {
			d.err = fmt.Errorf("custom metadata keys not strictly sorted at %q", k)
		}
		prev = k
		md.CustomMetadata[k] = bytes.Clone(v)
	}
	if d.err != nil {
		return nil
	}
	return md
}

func crcOf(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

package protocol

import "fmt"

// AuthMessage is BookKeeper's protobuf (proto2) message
//
//	message AuthMessage {
//	    required string authPluginName = 1;
//	    required bytes payload = 2;
//	}
//
// carried by v2 AUTH requests and responses. Decoded fields alias the frame.
type AuthMessage struct {
	// PluginName is the authPluginName field, kept as bytes so decoding does not allocate.
	PluginName []byte
	Payload    []byte
}

// Protobuf tags: field number << 3 | wire type 2 (length-delimited).
const (
	authPluginNameTag = 1<<3 | 2
	authPayloadTag    = 2<<3 | 2
)

// authMessageSize is the encoded size of m, as Java's protobuf writes it: both required fields,
// in field order, even when empty.
func authMessageSize(m AuthMessage) int {
	return 1 + varintSize(uint64(len(m.PluginName))) + len(m.PluginName) +
		1 + varintSize(uint64(len(m.Payload))) + len(m.Payload)
}

func appendAuthMessage(dst []byte, m AuthMessage) []byte {
	dst = append(dst, authPluginNameTag)
	dst = appendVarint(dst, uint64(len(m.PluginName)))
	dst = append(dst, m.PluginName...)
	dst = append(dst, authPayloadTag)
	dst = appendVarint(dst, uint64(len(m.Payload)))
	return append(dst, m.Payload...)
}

// parseAuthMessage decodes b, all of it, as an AuthMessage. It follows protobuf's rules as the
// Java parser applies them: fields may come in any order and the last occurrence wins; unknown
// fields (and fields 1 and 2 with another wire type) are skipped; both required fields must be
// present. Field number 0, groups (wire types 3 and 4, deprecated) and invalid wire types are
// rejected, as are over-long varints and lengths past the end.
func parseAuthMessage(b []byte) (AuthMessage, error) {
	var m AuthMessage
	var haveName, havePayload bool
	for len(b) > 0 {
		tag, n := readVarint(b)
		if n <= 0 || tag > 0xFFFFFFFF {
			return AuthMessage{}, fmt.Errorf("%w: bad protobuf tag", ErrMalformed)
		}
		b = b[n:]
		field, wireType := tag>>3, tag&7
		if field == 0 {
			return AuthMessage{}, fmt.Errorf("%w: protobuf field number 0", ErrMalformed)
		}
		var value []byte
		switch wireType {
		case 0:
			_, n = readVarint(b)
			if n <= 0 {
				return AuthMessage{}, fmt.Errorf("%w: bad protobuf varint", ErrMalformed)
			}
			b = b[n:]
		case 1, 5:
			size := 8
			if wireType == 5 {
				size = 4
			}
			if len(b) < size {
				return AuthMessage{}, fmt.Errorf("%w: truncated protobuf fixed field", ErrMalformed)
			}
			b = b[size:]
		case 2:
			length, n := readVarint(b)
			if n <= 0 || length > uint64(len(b)-n) {
				return AuthMessage{}, fmt.Errorf("%w: bad protobuf field length", ErrMalformed)
			}
			value = b[n : n+int(length) : n+int(length)]
			b = b[n+int(length):]
		default:
			return AuthMessage{}, fmt.Errorf("%w: unsupported protobuf wire type %d", ErrMalformed, wireType)
		}
		switch {
		case tag == authPluginNameTag:
			m.PluginName, haveName = value, true
		case tag == authPayloadTag:
			m.Payload, havePayload = value, true
		}
	}
	if !haveName || !havePayload {
		return AuthMessage{}, fmt.Errorf("%w: AuthMessage lacks a required field", ErrMalformed)
	}
	return m, nil
}

func varintSize(v uint64) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}

func appendVarint(dst []byte, v uint64) []byte {
	for v >= 0x80 {
		dst = append(dst, byte(v)|0x80)
		v >>= 7
	}
	return append(dst, byte(v))
}

// readVarint decodes a base-128 varint. n is the number of bytes read, or 0 if b ends first or
// the varint is longer than 10 bytes or overflows 64 bits.
func readVarint(b []byte) (v uint64, n int) {
	for i := 0; i < len(b) && i < 10; i++ {
		c := b[i]
		if i == 9 && c > 1 {
			return 0, 0
		}
		v |= uint64(c&0x7F) << (7 * i)
		if c < 0x80 {
			return v, i + 1
		}
	}
	return 0, 0
}

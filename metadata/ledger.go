package metadata

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
	"sort"
	"time"
)

// LedgerState is the lifecycle state of a ledger. The values are those of
// BookKeeper's LedgerMetadataFormat.State.
type LedgerState uint8

// Ledger states.
const (
	// StateOpen: a writer may add entries.
	StateOpen LedgerState = 1
	// StateInRecovery: a reader is fencing and recovering the ledger.
	StateInRecovery LedgerState = 2
	// StateClosed: LastEntryID and Length are final.
	StateClosed LedgerState = 3
)

func (s LedgerState) String() string {
	switch s {
	case StateOpen:
		return "OPEN"
	case StateInRecovery:
		return "IN_RECOVERY"
	case StateClosed:
		return "CLOSED"
	}
	return fmt.Sprintf("LedgerState(%d)", uint8(s))
}

func (s LedgerState) valid() bool { return s >= StateOpen && s <= StateClosed }

// DigestType is the entry digest of a ledger. The values are those of
// BookKeeper's LedgerMetadataFormat.DigestType.
type DigestType uint8

// Digest types.
const (
	DigestCRC32  DigestType = 1
	DigestHMAC   DigestType = 2
	DigestCRC32C DigestType = 3
	DigestDummy  DigestType = 4
)

func (d DigestType) String() string {
	switch d {
	case DigestCRC32:
		return "CRC32"
	case DigestHMAC:
		return "HMAC"
	case DigestCRC32C:
		return "CRC32C"
	case DigestDummy:
		return "DUMMY"
	}
	return fmt.Sprintf("DigestType(%d)", uint8(d))
}

func (d DigestType) valid() bool { return d >= DigestCRC32 && d <= DigestDummy }

// NoEntry is the entry id of "no entry": LastEntryID of an empty ledger, and
// of every ledger that is not closed.
const NoEntry int64 = -1

// Limits enforced by Validate. They keep one ledger's metadata well below
// etcd's default 1.5 MiB request limit.
const (
	// MaxEnsembleSize bounds EnsembleSize.
	MaxEnsembleSize = 1024
	// MaxPasswordLen bounds len(Password).
	MaxPasswordLen = 1024
	// MaxBookieIDLen bounds the length of a bookie id.
	MaxBookieIDLen = 255
	// MaxCustomKeyLen bounds the length of a custom metadata key.
	MaxCustomKeyLen = 1024
	// MaxEncodedSize bounds the encoded size of one ledger's metadata.
	MaxEncodedSize = 1 << 20
)

// Ensemble is one segment of a ledger: the bookies that store the entries from
// FirstEntryID up to (not including) the next ensemble's FirstEntryID.
type Ensemble struct {
	FirstEntryID int64
	// Bookies are bookie ids (host:port), EnsembleSize of them, in the order
	// that striping uses (entry e goes to Bookies[(e+i) % E], i < Qw).
	Bookies []string
}

// LedgerMetadata is what the metadata service stores about one ledger.
// BookKeeper's LedgerMetadataFormat has the same fields.
type LedgerMetadata struct {
	EnsembleSize    int
	WriteQuorumSize int
	AckQuorumSize   int
	State           LedgerState
	// LastEntryID is the last entry of a CLOSED ledger (NoEntry if it is
	// empty). It is NoEntry while the ledger is not closed.
	LastEntryID int64
	// Length is the total payload length in bytes of a CLOSED ledger; 0 while
	// it is not closed.
	Length int64
	// Ensembles is never empty; FirstEntryIDs start at 0 and strictly
	// increase.
	Ensembles  []Ensemble
	DigestType DigestType
	// Password is the ledger password as BookKeeper stores it (the bytes the
	// client was given; the master key is derived from them).
	Password []byte
	// CreationTime has millisecond precision once stored; the zero time
	// means unknown.
	CreationTime time.Time
	// CustomMetadata is opaque application data.
	CustomMetadata map[string][]byte
}

// Validate checks the invariants every stored ledger satisfies. Errors wrap
// ErrInvalidMetadata.
func (m *LedgerMetadata) Validate() error {
	if m == nil {
		return fmt.Errorf("%w: nil", ErrInvalidMetadata)
	}
	if err := m.validateQuorums(); err != nil {
		return err
	}
	if !m.State.valid() {
		return fmt.Errorf("%w: unknown state %d", ErrInvalidMetadata, uint8(m.State))
	}
	if !m.DigestType.valid() {
		return fmt.Errorf("%w: unknown digest type %d", ErrInvalidMetadata, uint8(m.DigestType))
	}
	if m.State == StateClosed {
		if m.LastEntryID < NoEntry {
			return fmt.Errorf("%w: closed with last entry id %d", ErrInvalidMetadata, m.LastEntryID)
		}
		if m.Length < 0 {
			return fmt.Errorf("%w: closed with negative length %d", ErrInvalidMetadata, m.Length)
		}
	} else if m.LastEntryID != NoEntry || m.Length != 0 {
		return fmt.Errorf("%w: %s ledger has last entry id %d and length %d (want %d and 0)",
			ErrInvalidMetadata, m.State, m.LastEntryID, m.Length, NoEntry)
	}
	if len(m.Password) > MaxPasswordLen {
		return fmt.Errorf("%w: password of %d bytes exceeds %d", ErrInvalidMetadata, len(m.Password), MaxPasswordLen)
	}
	if err := m.validateEnsembles(); err != nil {
		return err
	}
	for k := range m.CustomMetadata {
		if len(k) > MaxCustomKeyLen {
			return fmt.Errorf("%w: custom metadata key of %d bytes exceeds %d", ErrInvalidMetadata, len(k), MaxCustomKeyLen)
		}
	}
	return nil
}

func (m *LedgerMetadata) validateQuorums() error {
	e, qw, qa := m.EnsembleSize, m.WriteQuorumSize, m.AckQuorumSize
	if !(e >= qw && qw >= qa && qa >= 1) {
		return fmt.Errorf("%w: need ensemble >= write quorum >= ack quorum >= 1, have %d/%d/%d",
			ErrInvalidMetadata, e, qw, qa)
	}
	if e > MaxEnsembleSize {
		return fmt.Errorf("%w: ensemble size %d exceeds %d", ErrInvalidMetadata, e, MaxEnsembleSize)
	}
	return nil
}

func (m *LedgerMetadata) validateEnsembles() error {
	if len(m.Ensembles) == 0 {
		return fmt.Errorf("%w: no ensemble", ErrInvalidMetadata)
	}
	if first := m.Ensembles[0].FirstEntryID; first != 0 {
		return fmt.Errorf("%w: first ensemble starts at entry %d, not 0", ErrInvalidMetadata, first)
	}
	seen := make(map[string]struct{}, m.EnsembleSize)
	for i, ens := range m.Ensembles {
		if i > 0 && ens.FirstEntryID <= m.Ensembles[i-1].FirstEntryID {
			return fmt.Errorf("%w: ensemble %d starts at entry %d, not after %d",
				ErrInvalidMetadata, i, ens.FirstEntryID, m.Ensembles[i-1].FirstEntryID)
		}
		if len(ens.Bookies) != m.EnsembleSize {
			return fmt.Errorf("%w: ensemble %d (from entry %d) has %d bookies, ensemble size is %d",
				ErrInvalidMetadata, i, ens.FirstEntryID, len(ens.Bookies), m.EnsembleSize)
		}
		clear(seen)
		for _, b := range ens.Bookies {
			if err := ValidateBookieID(b); err != nil {
				return fmt.Errorf("%w: ensemble %d: %w", ErrInvalidMetadata, i, err)
			}
			if _, dup := seen[b]; dup {
				return fmt.Errorf("%w: ensemble %d lists bookie %q twice", ErrInvalidMetadata, i, b)
			}
			seen[b] = struct{}{}
		}
	}
	return nil
}

// Clone returns a deep copy.
func (m *LedgerMetadata) Clone() *LedgerMetadata {
	if m == nil {
		return nil
	}
	c := *m
	c.Ensembles = make([]Ensemble, len(m.Ensembles))
	for i, e := range m.Ensembles {
		c.Ensembles[i] = Ensemble{FirstEntryID: e.FirstEntryID, Bookies: slices.Clone(e.Bookies)}
	}
	c.Password = bytes.Clone(m.Password)
	if m.CustomMetadata != nil {
		c.CustomMetadata = make(map[string][]byte, len(m.CustomMetadata))
		for k, v := range m.CustomMetadata {
			c.CustomMetadata[k] = bytes.Clone(v)
		}
	}
	return &c
}

// Equal reports whether m and o describe the same metadata. Nil and empty
// slices and maps are equal; times are compared with time.Time.Equal.
func (m *LedgerMetadata) Equal(o *LedgerMetadata) bool {
	if m == nil || o == nil {
		return m == o
	}
	if m.EnsembleSize != o.EnsembleSize || m.WriteQuorumSize != o.WriteQuorumSize ||
		m.AckQuorumSize != o.AckQuorumSize || m.State != o.State ||
		m.LastEntryID != o.LastEntryID || m.Length != o.Length ||
		m.DigestType != o.DigestType || !bytes.Equal(m.Password, o.Password) ||
		!m.CreationTime.Equal(o.CreationTime) || len(m.Ensembles) != len(o.Ensembles) {
		return false
	}
	for i := range m.Ensembles {
		if m.Ensembles[i].FirstEntryID != o.Ensembles[i].FirstEntryID ||
			!slices.Equal(m.Ensembles[i].Bookies, o.Ensembles[i].Bookies) {
			return false
		}
	}
	return maps.EqualFunc(m.CustomMetadata, o.CustomMetadata, bytes.Equal)
}

// EnsembleAt returns the ensemble that stores entryID (the last ensemble
// whose FirstEntryID <= entryID). It returns false for a negative entry id
// or metadata without ensembles.
func (m *LedgerMetadata) EnsembleAt(entryID int64) (Ensemble, bool) {
	if entryID < 0 || len(m.Ensembles) == 0 {
		return Ensemble{}, false
	}
	i := sort.Search(len(m.Ensembles), func(i int) bool { return m.Ensembles[i].FirstEntryID > entryID })
	if i == 0 {
		return Ensemble{}, false
	}
	return m.Ensembles[i-1], true
}

// LastEnsemble returns the current (last) ensemble; false if there is none.
func (m *LedgerMetadata) LastEnsemble() (Ensemble, bool) {
	if len(m.Ensembles) == 0 {
		return Ensemble{}, false
	}
	return m.Ensembles[len(m.Ensembles)-1], true
}

// ContainsBookie reports whether bookieID is in any ensemble of the ledger.
func (m *LedgerMetadata) ContainsBookie(bookieID string) bool {
	for _, e := range m.Ensembles {
		if slices.Contains(e.Bookies, bookieID) {
			return true
		}
	}
	return false
}

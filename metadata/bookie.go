package metadata

import (
	"encoding/json"
	"fmt"
	"slices"
)

// BookieState says whether a registered bookie accepts new writes.
type BookieState uint8

// Bookie states. They double as BookieFilter bits.
const (
	BookieWritable BookieState = 1
	BookieReadOnly BookieState = 2
)

func (s BookieState) String() string {
	switch s {
	case BookieWritable:
		return "writable"
	case BookieReadOnly:
		return "readonly"
	}
	return fmt.Sprintf("BookieState(%d)", uint8(s))
}

func (s BookieState) valid() bool { return s == BookieWritable || s == BookieReadOnly }

// BookieFilter selects bookies by state in Registry.List.
type BookieFilter uint8

// Filters.
const (
	ListWritable = BookieFilter(BookieWritable)
	ListReadOnly = BookieFilter(BookieReadOnly)
	ListAll      = ListWritable | ListReadOnly
)

// Matches reports whether a bookie in state s passes the filter.
func (f BookieFilter) Matches(s BookieState) bool { return f&BookieFilter(s) != 0 }

// Endpoint is one way to reach a bookie (BookKeeper's
// BookieServiceInfo.Endpoint).
type Endpoint struct {
	// ID names the endpoint, e.g. "bookie" or "http".
	ID string `json:"id"`
	// Protocol, e.g. "bookie-rpc" or "http".
	Protocol string `json:"protocol"`
	Host     string `json:"host"`
	Port     int    `json:"port"`
	// Auth lists accepted authentication mechanisms, e.g. "tls".
	Auth []string `json:"auth,omitempty"`
}

// Endpoint ids a bookie registers.
const (
	EndpointBookie    = "bookie"     // the protocol, plaintext: the address in the bookie id
	EndpointBookieTLS = "bookie-tls" // the protocol over TLS (the bookie's tlsPort)
	EndpointHTTP      = "http"       // the admin HTTP server
)

// BookieInfo is what a bookie publishes when it registers.
type BookieInfo struct {
	// ID is the bookie id, normally host:port (see ValidateBookieID).
	ID string `json:"-"`
	// State is where the registration is filed (writable or read-only).
	State BookieState `json:"-"`
	// Endpoints lists how to reach the bookie.
	Endpoints []Endpoint `json:"endpoints,omitempty"`
	// FreeDiskBytes and TotalDiskBytes describe the ledger disks, for
	// placement.
	FreeDiskBytes  uint64 `json:"freeDiskBytes"`
	TotalDiskBytes uint64 `json:"totalDiskBytes"`
	// Properties are free-form (BookKeeper's BookieServiceInfo.properties).
	Properties map[string]string `json:"properties,omitempty"`
}

// Clone returns a deep copy.
func (b BookieInfo) Clone() BookieInfo {
	c := b
	if b.Endpoints != nil {
		c.Endpoints = make([]Endpoint, len(b.Endpoints))
		for i, e := range b.Endpoints {
			e.Auth = slices.Clone(e.Auth)
			c.Endpoints[i] = e
		}
	}
	if b.Properties != nil {
		c.Properties = make(map[string]string, len(b.Properties))
		for k, v := range b.Properties {
			c.Properties[k] = v
		}
	}
	return c
}

// Validate checks that the bookie can be registered.
func (b BookieInfo) Validate() error {
	if err := ValidateBookieID(b.ID); err != nil {
		return err
	}
	if !b.State.valid() {
		return fmt.Errorf("%w: bookie %s: unknown state %d", ErrInvalidBookieInfo, b.ID, uint8(b.State))
	}
	for _, e := range b.Endpoints {
		if e.Port < 0 || e.Port > 65535 {
			return fmt.Errorf("%w: bookie %s: endpoint %q port %d out of range", ErrInvalidBookieInfo, b.ID, e.ID, e.Port)
		}
	}
	return nil
}

// ValidateBookieID checks a bookie id with BookKeeper's rule: 1 to
// MaxBookieIDLen characters from [A-Za-z0-9:._-], and not "readonly".
// Such an id is safe as the last element of a key.
func ValidateBookieID(id string) error {
	if id == "" || len(id) > MaxBookieIDLen {
		return fmt.Errorf("%w: %q: length must be 1 to %d", ErrInvalidBookieID, id, MaxBookieIDLen)
	}
	if id == "readonly" {
		return fmt.Errorf("%w: %q is reserved", ErrInvalidBookieID, id)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			c == ':' || c == '.' || c == '_' || c == '-'
		if !ok {
			return fmt.Errorf("%w: %q: character %q not allowed", ErrInvalidBookieID, id, c)
		}
	}
	return nil
}

// bookieInfoVersion is the "v" field of the registration value.
const bookieInfoVersion = 1

type bookieInfoJSON struct {
	V int `json:"v"`
	BookieInfo
}

// EncodeBookieInfo encodes the registration value (see the package
// documentation). ID and State are not part of the value: they are in the key.
func EncodeBookieInfo(b BookieInfo) ([]byte, error) {
	return json.Marshal(bookieInfoJSON{V: bookieInfoVersion, BookieInfo: b})
}

// DecodeBookieInfo decodes a registration value; the caller fills in ID and
// State from the key. Errors wrap ErrInvalidBookieInfo.
func DecodeBookieInfo(data []byte) (BookieInfo, error) {
	var j bookieInfoJSON
	if err := json.Unmarshal(data, &j); err != nil {
		return BookieInfo{}, fmt.Errorf("%w: %w", ErrInvalidBookieInfo, err)
	}
	if j.V != bookieInfoVersion {
		return BookieInfo{}, fmt.Errorf("%w: value version %d, want %d", ErrInvalidBookieInfo, j.V, bookieInfoVersion)
	}
	return j.BookieInfo, nil
}

package metadata

import (
	"fmt"
	"net"
	"strconv"
	"strings"
)

// URI is a parsed metadata service URI, scheme://host1:port1,host2:port2/root,
// for example etcd://10.0.0.1:2379,10.0.0.2:2379/ledgers.
type URI struct {
	// Scheme selects the driver, e.g. "etcd".
	Scheme string
	// Hosts are the servers as written, host or host:port (IPv6 in
	// brackets); a driver supplies its default port where none is given.
	Hosts []string
	// Root is the path under which all of the cluster's keys live, e.g.
	// "/ledgers": one or more '/'-separated segments of [A-Za-z0-9._-],
	// without a trailing slash.
	Root string
}

// String returns the URI in the form ParseURI accepts.
func (u URI) String() string {
	return u.Scheme + "://" + strings.Join(u.Hosts, ",") + u.Root
}

// ParseURI parses a metadata service URI strictly: a scheme, at least one
// host, and a root path are required; user info, query and fragment are
// rejected. Errors wrap ErrBadURI and say what is wrong.
func ParseURI(s string) (URI, error) {
	bad := func(format string, args ...any) (URI, error) {
		return URI{}, fmt.Errorf("%w %q: %s", ErrBadURI, s, fmt.Sprintf(format, args...))
	}
	scheme, rest, ok := strings.Cut(s, "://")
	if !ok {
		return bad("want scheme://host:port[,host:port...]/root, e.g. etcd://127.0.0.1:2379/ledgers")
	}
	if err := checkScheme(scheme); err != nil {
		return bad("%v", err)
	}
	if i := strings.IndexAny(rest, "?#@"); i >= 0 {
		return bad("%q is not allowed (no user info, query or fragment)", rest[i])
	}
	hostPart, path, ok := strings.Cut(rest, "/")
	if !ok {
		return bad("root path missing, e.g. /ledgers")
	}
	if hostPart == "" {
		return bad("no host")
	}
	hosts := strings.Split(hostPart, ",")
	for _, h := range hosts {
		if err := checkHost(h); err != nil {
			return bad("%v", err)
		}
	}
	root := "/" + path
	if err := ValidateRoot(root); err != nil {
		return bad("%v", err)
	}
	return URI{Scheme: scheme, Hosts: hosts, Root: root}, nil
}

func checkScheme(s string) error {
	if s == "" {
		return fmt.Errorf("empty scheme")
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		letter := c >= 'a' && c <= 'z'
		if !(letter || i > 0 && (c >= '0' && c <= '9' || c == '+' || c == '-' || c == '.')) {
			return fmt.Errorf("bad scheme %q (lower-case letters, digits, '+', '-', '.')", s)
		}
	}
	return nil
}

func checkHost(h string) error {
	if h == "" {
		return fmt.Errorf("empty host in host list")
	}
	host, port := h, ""
	switch {
	case strings.HasPrefix(h, "["):
		end := strings.Index(h, "]")
		if end < 0 {
			return fmt.Errorf("host %q: missing ']'", h)
		}
		host = h[1:end]
		if ip := net.ParseIP(host); ip == nil || ip.To4() != nil {
			return fmt.Errorf("host %q: %q is not an IPv6 address", h, host)
		}
		switch after := h[end+1:]; {
		case after == "":
		case strings.HasPrefix(after, ":"):
			port = after[1:]
			if port == "" {
				return fmt.Errorf("host %q: empty port", h)
			}
		default:
			return fmt.Errorf("host %q: junk after ']'", h)
		}
	case strings.Contains(h, ":"):
		host, port, _ = strings.Cut(h, ":")
		if port == "" {
			return fmt.Errorf("host %q: empty port", h)
		}
		fallthrough
	default:
		if host == "" {
			return fmt.Errorf("host %q: empty host name", h)
		}
		for i := 0; i < len(host); i++ {
			c := host[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '-' || c == '_') {
				return fmt.Errorf("host %q: character %q not allowed in a host name", h, c)
			}
		}
	}
	if port != "" {
		n, err := strconv.Atoi(port)
		if err != nil || n < 1 || n > 65535 || port[0] == '+' || port[0] == '-' {
			return fmt.Errorf("host %q: port %q is not a number from 1 to 65535", h, port)
		}
	}
	return nil
}

// ValidateRoot checks a root path: '/' followed by one or more
// '/'-separated segments of [A-Za-z0-9._-] (not "." or ".."), no trailing
// slash, at most 200 bytes.
func ValidateRoot(root string) error {
	if !strings.HasPrefix(root, "/") || root == "/" {
		return fmt.Errorf("root path %q: want /name[/name...], e.g. /ledgers", root)
	}
	if len(root) > 200 {
		return fmt.Errorf("root path of %d bytes is longer than 200", len(root))
	}
	for _, seg := range strings.Split(root[1:], "/") {
		if seg == "" {
			return fmt.Errorf("root path %q: empty segment or trailing slash", root)
		}
		if seg == "." || seg == ".." {
			return fmt.Errorf("root path %q: segment %q not allowed", root, seg)
		}
		for i := 0; i < len(seg); i++ {
			c := seg[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '-' || c == '_') {
				return fmt.Errorf("root path %q: character %q not allowed", root, c)
			}
		}
	}
	return nil
}

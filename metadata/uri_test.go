package metadata

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestParseURI(t *testing.T) {
	good := []struct {
		in    string
		hosts []string
		root  string
	}{
		{"etcd://127.0.0.1:2379/ledgers", []string{"127.0.0.1:2379"}, "/ledgers"},
		{"etcd://h1:2379,h2:2379,h3/ledgers", []string{"h1:2379", "h2:2379", "h3"}, "/ledgers"},
		{"etcd://[::1]:2379/a/b-c/d_e.f", []string{"[::1]:2379"}, "/a/b-c/d_e.f"},
		{"zk+hierarchical://zk1:2181/ledgers", []string{"zk1:2181"}, "/ledgers"},
	}
	for _, g := range good {
		u, err := ParseURI(g.in)
		if err != nil {
			t.Errorf("%s: %v", g.in, err)
			continue
		}
		if !slices.Equal(u.Hosts, g.hosts) || u.Root != g.root || u.String() != g.in {
			t.Errorf("%s: parsed %+v", g.in, u)
		}
	}
	bad := []struct{ in, why string }{
		{"", "want scheme://"},
		{"127.0.0.1:2379/ledgers", "want scheme://"},
		{"://h:1/ledgers", "empty scheme"},
		{"ETCD://h:1/ledgers", "bad scheme"},
		{"etcd://h:2379", "root path missing"},
		{"etcd:///ledgers", "no host"},
		{"etcd://h:2379/", "want /name"},
		{"etcd://h:2379/ledgers/", "trailing slash"},
		{"etcd://h:2379//ledgers", "empty segment"},
		{"etcd://h:2379/led gers", "not allowed"},
		{"etcd://h:2379/../x", "not allowed"},
		{"etcd://h1:2379,,h2:2379/ledgers", "empty host"},
		{"etcd://h1:2379,/ledgers", "empty host"},
		{"etcd://h:/ledgers", "empty port"},
		{"etcd://h:0/ledgers", "1 to 65535"},
		{"etcd://h:65536/ledgers", "1 to 65535"},
		{"etcd://h:x/ledgers", "1 to 65535"},
		{"etcd://h:+1/ledgers", "1 to 65535"},
		{"etcd://:2379/ledgers", "empty host name"},
		{"etcd://h_!:1/ledgers", "not allowed"},
		{"etcd://[::1/ledgers", "missing ']'"},
		{"etcd://[1.2.3.4]:1/ledgers", "not an IPv6"},
		{"etcd://user@h:1/ledgers", "not allowed"},
		{"etcd://h:1/ledgers?x=1", "not allowed"},
		{"etcd://h:1/ledgers#f", "not allowed"},
	}
	for _, b := range bad {
		_, err := ParseURI(b.in)
		if !errors.Is(err, ErrBadURI) || !strings.Contains(err.Error(), b.why) {
			t.Errorf("%q: want ErrBadURI mentioning %q, got %v", b.in, b.why, err)
		}
	}
}

func TestOpenUnknownScheme(t *testing.T) {
	_, err := Open(context.Background(), "nosuch://h:1/ledgers", Options{})
	if !errors.Is(err, ErrBadURI) || !strings.Contains(err.Error(), "no driver") {
		t.Fatalf("got %v", err)
	}
}

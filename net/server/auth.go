package server

import (
	"crypto/subtle"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// AuthProvider is a server-side authentication plugin, BookKeeper's BookieAuthProvider.Factory.
// A client authenticates by sending AUTH messages whose authPluginName equals Name; each
// message's payload is handed to the connection's AuthSession, whose answer goes back in an
// AUTH response. Until the session reports done, adds, reads and batch reads get EUA.
type AuthProvider interface {
	// Name is the plugin name the client must send. A message with another name closes the
	// connection, as BookKeeper does for v2 clients.
	Name() string
	// NewSession starts an exchange for one connection; remote is the client's address.
	NewSession(remote string) AuthSession
}

// AuthSession is one connection's authentication exchange; it may take several rounds. Step
// runs on the connection's event loop (or TLS reader goroutine), so it must not block.
type AuthSession interface {
	// Step consumes one client payload (which aliases the receive buffer: copy what is kept)
	// and returns the payload to answer with. done reports that the client is now
	// authenticated; a non-nil err rejects it, and the server closes the connection.
	Step(payload []byte) (response []byte, done bool, err error)
}

// TokenAuthPluginName is the plugin name of the shared-token provider.
const TokenAuthPluginName = "ringkeeper.token"

// ErrAuthFailed is the error of a rejected authentication.
var ErrAuthFailed = errors.New("server: authentication failed")

// TokenAuth is a single-round AuthProvider: the client's payload must equal a shared secret
// token, compared in constant time. It is as strong as the secrecy of the token and of the
// channel: use it over TLS.
type TokenAuth struct {
	name  string
	token []byte
}

// NewTokenAuth returns a TokenAuth for token (copied) under plugin name name
// (TokenAuthPluginName when empty).
func NewTokenAuth(name string, token []byte) *TokenAuth {
	if name == "" {
		name = TokenAuthPluginName
	}
	return &TokenAuth{name: name, token: append([]byte(nil), token...)}
}

// Name implements AuthProvider.
func (a *TokenAuth) Name() string { return a.name }

// NewSession implements AuthProvider.
func (a *TokenAuth) NewSession(string) AuthSession { return tokenSession{a} }

type tokenSession struct{ a *TokenAuth }

// Step accepts the payload if it is the token. An empty token never matches.
func (s tokenSession) Step(payload []byte) ([]byte, bool, error) {
	if len(s.a.token) == 0 || subtle.ConstantTimeCompare(payload, s.a.token) != 1 {
		return nil, false, ErrAuthFailed
	}
	return nil, true, nil
}

// AuthorizeRoles is BookKeeper's BookieAuthZFactory as an AuthorizeCertificate: the client's
// certificate must carry a role, and its first role must be one of allowed. Roles are in the
// subject's OU, in BookKeeper's format: ";"-separated "code:value" parts, where code 0 lists
// the roles, ","-separated (for example OU=0:ingest,audit;1:cluster-a). The first OU value
// with a code-0 part counts.
func AuthorizeRoles(allowed []string) func(*x509.Certificate) error {
	return func(cert *x509.Certificate) error {
		if cert == nil {
			return errors.New("server: no client certificate, so no role (authorizedRoles)")
		}
		roles := CertificateRoles(cert)
		if len(roles) == 0 {
			return fmt.Errorf("server: client certificate %q has no role in its OU (0:role,...); authorizedRoles %v", cert.Subject, allowed)
		}
		if !slices.Contains(allowed, roles[0]) {
			return fmt.Errorf("server: client certificate role %q is not in authorizedRoles %v", roles[0], allowed)
		}
		return nil
	}
}

// CertificateRoles returns the roles in cert's subject OU (see AuthorizeRoles), nil if none.
func CertificateRoles(cert *x509.Certificate) []string {
	for _, ou := range cert.Subject.OrganizationalUnit {
		for part := range strings.SplitSeq(ou, ";") {
			code, value, ok := strings.Cut(part, ":")
			if !ok || strings.TrimSpace(code) != "0" {
				continue
			}
			var roles []string
			for r := range strings.SplitSeq(value, ",") {
				roles = append(roles, strings.TrimSpace(r))
			}
			return roles
		}
	}
	return nil
}

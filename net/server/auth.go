package server

import (
	"crypto/subtle"
	"errors"
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

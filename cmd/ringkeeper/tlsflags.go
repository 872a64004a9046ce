package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"

	"github.com/spf13/pflag"

	"github.com/ringkeeper/ringkeeper/client"
)

// clientTLSFlags are the TLS settings of the commands that connect a client to bookies, named
// after BookKeeper's client keys (tlsTrustStore, tlsCertificatePath, tlsKeyStore,
// tlsHostnameVerificationEnabled). With a trust store the client speaks TLS to each bookie's
// TLS endpoint (its tlsPort); without one, plaintext.
type clientTLSFlags struct {
	trustStore, certificate, key string
	hostnameVerification         bool
}

func (t *clientTLSFlags) register(f *pflag.FlagSet) {
	f.StringVar(&t.trustStore, "tls-trust-store", "", "PEM file of the CAs that sign the bookies' certificates: connect to bookies over TLS (their tlsPort)")
	f.StringVar(&t.certificate, "tls-certificate", "", "PEM file of this client's certificate, for bookies that require one (tlsClientAuthentication)")
	f.StringVar(&t.key, "tls-key", "", "PEM file of the key of --tls-certificate")
	f.BoolVar(&t.hostnameVerification, "tls-hostname-verification", true, "check that a bookie's certificate names the address it is reached at (its registered host, usually an IP address)")
}

// enabled reports whether any TLS flag was given.
func (t *clientTLSFlags) enabled() bool {
	return t.trustStore != "" || t.certificate != "" || t.key != "" || !t.hostnameVerification
}

// apply sets cfg's transport TLS from the flags (nothing when none was given).
func (t *clientTLSFlags) apply(cfg *client.Config) error {
	if !t.enabled() {
		return nil
	}
	if t.trustStore == "" {
		return errors.New("--tls-certificate, --tls-key and --tls-hostname-verification need --tls-trust-store")
	}
	pem, err := os.ReadFile(t.trustStore)
	if err != nil {
		return fmt.Errorf("--tls-trust-store: %w", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		return fmt.Errorf("--tls-trust-store %s: no PEM certificate in it", t.trustStore)
	}
	tc := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	switch {
	case t.certificate != "" && t.key != "":
		cert, err := tls.LoadX509KeyPair(t.certificate, t.key)
		if err != nil {
			return fmt.Errorf("--tls-certificate/--tls-key: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	case t.certificate != "" || t.key != "":
		return errors.New("--tls-certificate and --tls-key go together")
	}
	cfg.Transport.TLS = tc
	cfg.Transport.TLSHostnameVerificationDisabled = !t.hostnameVerification
	return nil
}

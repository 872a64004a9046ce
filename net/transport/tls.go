package transport

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"time"
)

// verifyWithoutHostname makes cfg check the bookie's certificate as crypto/tls does (a chain
// to RootCAs through the intermediates the bookie sent, valid at cfg.Time or now, for server
// authentication) except for the name it is for (Config.TLSHostnameVerificationDisabled).
// cfg.VerifyConnection, if set, runs after that check.
func verifyWithoutHostname(cfg *tls.Config) {
	next := cfg.VerifyConnection
	roots, clock := cfg.RootCAs, cfg.Time
	cfg.InsecureSkipVerify = true
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		certs := cs.PeerCertificates
		if len(certs) == 0 {
			return errors.New("transport: the bookie sent no certificate")
		}
		opts := x509.VerifyOptions{Roots: roots, CurrentTime: time.Now(), Intermediates: x509.NewCertPool(),
			KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
		if clock != nil {
			opts.CurrentTime = clock()
		}
		for _, c := range certs[1:] {
			opts.Intermediates.AddCert(c)
		}
		if _, err := certs[0].Verify(opts); err != nil {
			return &tls.CertificateVerificationError{UnverifiedCertificates: certs, Err: err}
		}
		if next != nil {
			return next(cs)
		}
		return nil
	}
}

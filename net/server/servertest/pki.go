package servertest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// CA is a throwaway certificate authority for TLS tests: it issues server and client
// certificates with chosen names and validity periods, made in memory with crypto/x509.
type CA struct {
	Cert *x509.Certificate
	Pool *x509.CertPool // holds Cert alone: a RootCAs or ClientCAs that trusts this CA
	key  *ecdsa.PrivateKey
}

var serial atomic.Int64

// NewCA makes a CA valid from an hour ago to a day from now.
func NewCA(name string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial.Add(1)), Subject: pkix.Name{CommonName: name},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &CA{Cert: cert, Pool: pool, key: key}, nil
}

// Leaf describes a certificate for CA.Issue.
type Leaf struct {
	// NotBefore and NotAfter bound the validity period; zero values mean an hour ago and a
	// day from now.
	NotBefore, NotAfter time.Time
	// DNSNames and IPs are the subject alternative names.
	DNSNames []string
	IPs      []net.IP
	// Client makes a client certificate (ExtKeyUsageClientAuth) instead of a server one.
	Client bool
	// OU is the subject's organizational units (BookKeeper puts roles there: "0:role,...").
	OU []string
}

// Issue makes a certificate signed by the CA.
func (ca *CA) Issue(l Leaf) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	now := time.Now()
	if l.NotBefore.IsZero() {
		l.NotBefore = now.Add(-time.Hour)
	}
	if l.NotAfter.IsZero() {
		l.NotAfter = now.Add(24 * time.Hour)
	}
	usage := x509.ExtKeyUsageServerAuth
	if l.Client {
		usage = x509.ExtKeyUsageClientAuth
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial.Add(1)), Subject: pkix.Name{CommonName: "ringkeeper test", OrganizationalUnit: l.OU},
		NotBefore: l.NotBefore, NotAfter: l.NotAfter,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
		DNSNames: l.DNSNames, IPAddresses: l.IPs,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		return tls.Certificate{}, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}

// CertPEM is the PEM encoding of c's certificate chain (a certificate file).
func CertPEM(c tls.Certificate) []byte {
	var out []byte
	for _, der := range c.Certificate {
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})...)
	}
	return out
}

// KeyPEM is the PEM encoding of c's private key (PKCS #8).
func KeyPEM(c tls.Certificate) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(c.PrivateKey)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// PEM is the PEM encoding of the CA's certificate (a trust store file).
func (ca *CA) PEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Cert.Raw})
}

// WriteFiles writes the CA's certificate and c's certificate and key as PEM files in dir
// (ca.crt, name.crt, name.key), for configs that name files, and returns their paths.
func (ca *CA) WriteFiles(dir, name string, c tls.Certificate) (caFile, certFile, keyFile string, err error) {
	key, err := KeyPEM(c)
	if err != nil {
		return "", "", "", err
	}
	caFile, certFile, keyFile = filepath.Join(dir, "ca.crt"), filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	for _, f := range []struct {
		path string
		data []byte
	}{{caFile, ca.PEM()}, {certFile, CertPEM(c)}, {keyFile, key}} {
		if err := os.WriteFile(f.path, f.data, 0o600); err != nil {
			return "", "", "", err
		}
	}
	return caFile, certFile, keyFile, nil
}

// MustCA is NewCA for tests: an error fails t.
func MustCA(t testing.TB, name string) *CA {
	t.Helper()
	ca, err := NewCA(name)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// MustIssue is Issue for tests: an error fails t.
func (ca *CA) MustIssue(t testing.TB, l Leaf) tls.Certificate {
	t.Helper()
	c, err := ca.Issue(l)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

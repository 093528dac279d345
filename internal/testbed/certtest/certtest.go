// Package certtest makes certificates for tests: a CA, a server certificate for loopback and
// client certificates, written as PEM files.
package certtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// CA is a certificate authority whose files live in a test's temporary folder.
type CA struct {
	// CertFile is the CA's certificate (PEM), for clients' roots and servers' client CAs.
	CertFile string

	dir  string
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	n    int64
}

// NewCA makes a CA named name.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	ca := &CA{dir: t.TempDir()}
	key := genKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ca.cert, _ = x509.ParseCertificate(der)
	ca.key = key
	ca.CertFile = ca.write(t, name+"-ca.pem", "CERTIFICATE", der)
	return ca
}

// Server issues a certificate for 127.0.0.1, ::1 and localhost and returns its files.
func (ca *CA) Server(t testing.TB, name string) (certFile, keyFile string) {
	t.Helper()
	return ca.issue(t, name, x509.ExtKeyUsageServerAuth, []string{"localhost"}, []net.IP{net.ParseIP("127.0.0.1"), net.IPv6loopback})
}

// Client issues a client certificate whose subject CN is cn and returns its files.
func (ca *CA) Client(t testing.TB, cn string) (certFile, keyFile string) {
	t.Helper()
	return ca.issue(t, cn, x509.ExtKeyUsageClientAuth, nil, nil)
}

func (ca *CA) issue(t testing.TB, cn string, usage x509.ExtKeyUsage, dns []string, ips []net.IP) (string, string) {
	ca.n++
	key := genKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(ca.n + 1), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
		DNSNames: dns, IPAddresses: ips,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	name := cn + "-" + big.NewInt(ca.n).String()
	return ca.write(t, name+".pem", "CERTIFICATE", der), ca.write(t, name+"-key.pem", "EC PRIVATE KEY", kder)
}

func (ca *CA) write(t testing.TB, name, kind string, der []byte) string {
	path := filepath.Join(ca.dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func genKey(t testing.TB) *ecdsa.PrivateKey {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

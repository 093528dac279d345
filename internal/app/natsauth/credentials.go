package natsauth

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/nats-io/nkeys"
)

// A credentials folder holds <role>.nk, each role's nkey seed (what its processes are given
// as --nats-creds), and ServerFile, the nats-server configuration of the roles' users.
const (
	seedSuffix = ".nk"
	ServerFile = "nats-users.conf"
)

// SeedFile is the path of role's seed in dir.
func SeedFile(dir string, role Role) string { return filepath.Join(dir, string(role)+seedSuffix) }

// Ensure makes the credentials folder dir hold a seed for every role, creating the folder
// (0700) and each missing seed (0600), and keeping those it holds: a restart keeps the
// credentials its clients were given. It returns each role's public key.
func Ensure(dir string) (map[Role]string, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("nats credentials: %w", err)
	}
	keys := make(map[Role]string, len(Roles))
	for _, role := range Roles {
		path := SeedFile(dir, role)
		kp, err := readSeed(path)
		if errors.Is(err, fs.ErrNotExist) {
			kp, err = writeSeed(path)
		}
		if err != nil {
			return nil, fmt.Errorf("nats credentials of %s: %w", role, err)
		}
		if keys[role], err = kp.PublicKey(); err != nil {
			return nil, fmt.Errorf("nats credentials of %s: %w", role, err)
		}
	}
	return keys, nil
}

// readSeed reads a user's nkey seed file.
func readSeed(path string) (nkeys.KeyPair, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	kp, err := nkeys.ParseDecoratedNKey(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return kp, nil
}

// writeSeed creates a user's nkey and writes its seed, readable by the owner alone; a file
// that appeared meanwhile is not overwritten.
func writeSeed(path string) (nkeys.KeyPair, error) {
	kp, err := nkeys.CreateUser()
	if err != nil {
		return nil, err
	}
	seed, err := kp.Seed()
	if err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	_, err = f.Write(append(seed, '\n'))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
		return nil, err
	}
	return kp, nil
}

// ServerConfig is the nats-server configuration of the roles' users, authenticated by keys:
// an authorization block to include in the server's configuration file
// (include ./nats-users.conf). The embedded server gets the same users from Users.
func (c Config) ServerConfig(keys map[Role]string) ([]byte, error) {
	var b bytes.Buffer
	b.WriteString("# quotaflow's NATS users, one per role, written by `quotaflow nats-auth`: include it in the\n")
	b.WriteString("# server's configuration. Each role may do what its processes need and no more (docs/security.md).\n")
	roles, users, err := c.users(keys)
	if err != nil {
		return nil, err
	}
	b.WriteString("authorization {\n  users = [\n")
	for i, u := range users {
		perms := u.Permissions
		fmt.Fprintf(&b, "    # %s\n    {\n      nkey: %s\n      permissions: {\n", roles[i], u.Nkey)
		fmt.Fprintf(&b, "        publish: {\n          allow: %s\n", list(perms.Publish.Allow))
		if len(perms.Publish.Deny) > 0 {
			fmt.Fprintf(&b, "          deny: %s\n", list(perms.Publish.Deny))
		}
		fmt.Fprintf(&b, "        }\n        subscribe: {\n          allow: %s\n        }\n      }\n    }\n", list(perms.Subscribe.Allow))
	}
	b.WriteString("  ]\n}\n")
	return b.Bytes(), nil
}

// list is subjects as a configuration list, one quoted subject a line.
func list(subjects []string) string {
	var b strings.Builder
	b.WriteString("[\n")
	for _, s := range sorted(subjects) {
		fmt.Fprintf(&b, "            %q\n", s)
	}
	b.WriteString("          ]")
	return b.String()
}

// Write makes dir hold a seed for every role (Ensure) and the server's users file
// (ServerFile) for them, and returns that file's path. The users file holds public keys only,
// so it is written 0644: the server must read it, whoever it runs as.
func (c Config) Write(dir string) (string, error) {
	keys, err := Ensure(dir)
	if err != nil {
		return "", err
	}
	conf, err := c.ServerConfig(keys)
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, ServerFile)
	if err := os.WriteFile(path, conf, 0o644); err != nil {
		return "", fmt.Errorf("nats users: %w", err)
	}
	return path, nil
}

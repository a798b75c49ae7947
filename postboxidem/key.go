package postboxidem

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"strings"
)

// MaxKeyBytes is the longest Idempotency-Key value accepted, unquoted.
const MaxKeyBytes = 255

// ParseKey reads an Idempotency-Key header value and returns the key.
//
// The IETF draft makes the field a Structured Field String: a quoted
// string of printable ASCII in which only \" and \\ are escapes, with no
// parameters. Many clients send the key bare instead, as Stripe documents
// it, so a bare value is accepted too: printable ASCII without '"', '\' or
// ',' (a comma most likely means a proxy joined two header lines into
// one). Both forms name the same key: "k1" and k1 are one key. The key,
// unquoted, is 1 to MaxKeyBytes bytes long.
func ParseKey(header string) (string, error) {
	// net/http trims the value; a value from elsewhere is trimmed as a
	// Structured Field parser does: spaces only.
	v := strings.Trim(header, " ")
	if v == "" {
		return "", errors.New("is empty")
	}
	var key string
	if v[0] == '"' {
		k, err := unquote(v)
		if err != nil {
			return "", err
		}
		key = k
	} else {
		for i := 0; i < len(v); i++ {
			c := v[i]
			if c < 0x20 || c > 0x7e {
				return "", errors.New("must be printable ASCII")
			}
			if c == '"' || c == '\\' || c == ',' {
				return "", errors.New(`must be a quoted string, or bare printable ASCII without '"', '\' or ','`)
			}
		}
		key = v
	}
	if key == "" {
		return "", errors.New("is empty")
	}
	if len(key) > MaxKeyBytes {
		return "", errors.New("is longer than 255 bytes")
	}
	return key, nil
}

// unquote parses a Structured Field String that must fill all of v.
func unquote(v string) (string, error) {
	var b strings.Builder
	for i := 1; i < len(v); i++ {
		c := v[i]
		switch {
		case c == '\\':
			i++
			if i == len(v) || (v[i] != '"' && v[i] != '\\') {
				return "", errors.New(`has an escape other than \" or \\`)
			}
			b.WriteByte(v[i])
		case c == '"':
			if i != len(v)-1 {
				return "", errors.New("has text after the closing quote (parameters are not allowed)")
			}
			return b.String(), nil
		case c < 0x20 || c > 0x7e:
			return "", errors.New("must be printable ASCII")
		default:
			b.WriteByte(c)
		}
		if b.Len() > MaxKeyBytes {
			return "", errors.New("is longer than 255 bytes")
		}
	}
	return "", errors.New("has no closing quote")
}

// keyVersion starts the hashed material, so that a change of what goes
// into the key can never meet a record hashed the old way.
const keyVersion = "postboxidem/1"

// keyHash identifies a record: SHA-256 over the method, the path, the raw
// query (verbatim: a client must resend the same query with the same key),
// the caller's identity and the key. Each part is length-prefixed, so no
// choice of parts can be read as another choice ("a:b" + "c" is not
// "a" + "b:c").
func keyHash(method, path, rawQuery, identity, key string) []byte {
	h := sha256.New()
	var n [8]byte
	for _, s := range [...]string{keyVersion, method, path, rawQuery, identity, key} {
		binary.BigEndian.PutUint64(n[:], uint64(len(s)))
		h.Write(n[:])
		h.Write([]byte(s))
	}
	return h.Sum(nil)
}

// fingerprint identifies a request body.
func fingerprint(body []byte) []byte {
	s := sha256.Sum256(body)
	return s[:]
}

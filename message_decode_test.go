package postbox

import (
	"encoding/json"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/postbox-go/postbox/postboxdriver"
)

// headerCorpus is stored columns of every shape the decoder tells apart:
// plain, escaped (every escape encoding/json writes or reads), non-ASCII,
// invalid UTF-8, surrogates, control characters, and broken syntax.
func headerCorpus(t testing.TB) [][]byte {
	t.Helper()
	var out [][]byte
	for _, row := range benchRows(t) {
		out = append(out, row.rec.Headers)
	}
	for _, s := range []string{
		``, `{}`, ` { } `, "\t{\r\n}\n", `{"a":"b"}`, ` {"a" : "b" , "c":"d"} `, `{"a":"b","a":"c"}`,
		`{"":""}`, `{"a":""}`, `{"a":"\""}`, `{"a":"\\"}`, `{"a":"\/"}`, `{"a":"\b\f\n\r\t"}`,
		`{"a":"\u0026\u003c\u003e"}`, `{"a":"\u2028\u2029"}`, `{"a":"\u0000"}`, `{"a":"\u00e9\n"}`,
		`{"a":"\u00E9"}`, `{"a":"\uFFFF"}`, `{"a":"\ud83d\ude00"}`, `{"a":"\ud83d"}`, `{"a":"\ude00"}`,
		`{"a":"\ud83dx"}`, `{"a":"\ud83d\u0041"}`, `{"a":"\u12"}`, `{"a":"\u123"}`, `{"a":"x\u00e"}`, `{"a":"\u1"}`, `{"a":"\u12g4"}`, `{"a":"\u"}`,
		`{"a":"\x"}`, `{"a":"\'"}`, `{"a":"\`, `{"a":"\"`, `{"a":"\\\"x"}`, `{"a\nb":"c"}`,
		`{"a":"é"}`, `{"é":"ü\n"}`, `{"a":"é\u0026"}`, "{\"a\":\"\xff\"}", "{\"a\":\"\xc3\"}",
		"{\"a\":\"\xed\xa0\x80\"}", "{\"a\":\"x\xff\\n\"}", "{\"a\":\"\\\xff\"}", "{\"a\":\"\\\x01\"}",
		"{\"a\":\"\x01\"}", "{\"a\":\"\x7f\"}", "{\"a\":\"\x1f\\n\"}", "\xef\xbb\xbf{\"a\":\"b\"}",
		`null`, `[]`, `"x"`, `{"a":1}`, `{"a":null}`, `{"a":true}`, `{"a":["b"]}`, `{"a":{"b":"c"}}`,
		`{"a":"b"} {}`, `{"a":"b"`, `{"a":"b",}`, `{"a" "b"}`, `{"a":"b" "c":"d"}`, `{a:"b"}`, `{`, `}`,
		`{"a":"b"}x`, `{"a":`, `{"a"`, `{"a`, `{"a":"b`, `{,}`, `{"a":"b",,"c":"d"}`,
	} {
		out = append(out, []byte(s))
	}
	// The seed corpus of FuzzDecodeHeaders.
	files, _ := filepath.Glob(filepath.Join("testdata", "fuzz", "FuzzDecodeHeaders", "*"))
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(string(raw)), "\n")
		if len(lines) != 2 || !strings.HasPrefix(lines[1], "[]byte(") {
			continue
		}
		s, err := strconv.Unquote(strings.TrimSuffix(strings.TrimPrefix(lines[1], "[]byte("), ")"))
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		out = append(out, []byte(s))
	}
	// Random headers as encoding/json writes them, and as a writer in
	// another language might, without HTML escapes.
	rng := rand.New(rand.NewPCG(1, 2))
	alphabet := []rune("abcXYZ09-_ .:/=;,\"\\<>&'\x00\x01\n\r\t\x7fé€😀\u2028\u2029\ufffd")
	str := func() string {
		var sb strings.Builder
		for range rng.IntN(12) {
			if rng.IntN(40) == 0 {
				sb.WriteByte(byte(0x80 + rng.IntN(0x80))) // invalid UTF-8
				continue
			}
			sb.WriteRune(alphabet[rng.IntN(len(alphabet))])
		}
		return sb.String()
	}
	for i := range 200 {
		h := map[string]string{}
		for range rng.IntN(20) {
			h[str()] = str()
		}
		b, err := json.Marshal(h)
		if err != nil {
			t.Fatal(err)
		}
		if i%2 == 1 {
			var sb strings.Builder
			enc := json.NewEncoder(&sb)
			enc.SetEscapeHTML(false)
			if err := enc.Encode(h); err != nil {
				t.Fatal(err)
			}
			b = []byte(sb.String())
		}
		out = append(out, b)
	}
	return out
}

// longRuns is stored columns with long plain runs and one other byte at
// every position, across the eight-byte words the scanner reads at once.
func longRuns() [][]byte {
	var out [][]byte
	for _, n := range []int{0, 1, 2, 5, 6, 7, 8, 9, 10, 15, 16, 17, 23, 24, 25, 33} {
		for _, c := range []string{`"`, `\`, `\\`, `\n`, `\u0026`, "\x01", "\x7f", "é", "\xff"} {
			for pos := range n + 1 {
				v := strings.Repeat("v", pos) + c + strings.Repeat("w", n-pos)
				out = append(out, []byte(`{"`+strings.Repeat("k", n)+`":"`+v+`","x":"`+strings.Repeat("y", n)+`"}`))
			}
		}
	}
	return out
}

// TestDecodeHeadersMatchesEncodingJSON holds DecodeHeaders to
// encoding/json (checkDecodeHeaders) on long plain runs, and on the
// corpus, on prefixes of each entry (unterminated strings and objects
// everywhere) and on each entry with one byte replaced.
func TestDecodeHeadersMatchesEncodingJSON(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	special := []byte("\"\\{}:, \x00\x1f\x7f\x80\xffnu0aA")
	for _, b := range longRuns() {
		checkDecodeHeaders(t, b)
	}
	for _, b := range headerCorpus(t) {
		checkDecodeHeaders(t, b)
		step := 1 + len(b)/128 // every prefix of short entries, a sample of long ones
		for n := 0; n < len(b); n += step {
			checkDecodeHeaders(t, b[:n])
		}
		for range 10 {
			if len(b) == 0 {
				break
			}
			m := []byte(string(b))
			m[rng.IntN(len(m))] = special[rng.IntN(len(special))]
			checkDecodeHeaders(t, m)
		}
	}
}

// TestDecodeHeadersLeavesInputAlone: the decoded strings are copies, so
// the caller (a driver reusing its row buffer) may overwrite the column.
func TestDecodeHeadersLeavesInputAlone(t *testing.T) {
	b := []byte(`{"a":"b","c":"d\u0026","é":"ü"}`)
	h, err := DecodeHeaders(b)
	if err != nil {
		t.Fatal(err)
	}
	for i := range b {
		b[i] = 'x'
	}
	if want := map[string]string{"a": "b", "c": "d&", "é": "ü"}; !reflect.DeepEqual(h, want) {
		t.Fatalf("after the column was overwritten, headers %q, want %q", h, want)
	}
}

// TestRelayEnvelopeMatchesEncodingJSON: the relay's envelope of a row is
// the one newEnvelope makes of the headers as encoding/json reads them.
func TestRelayEnvelopeMatchesEncodingJSON(t *testing.T) {
	created := time.Date(2026, 1, 2, 3, 4, 5, 6, time.FixedZone("x", 3600))
	for _, retention := range []time.Duration{-1, 0, DefaultRetention} {
		r := &relay{cfg: &Config{Source: "/cfg"}, horizon: replayHorizon(retention)}
		rows := benchRows(t)
		for _, key := range []string{"", "k"} {
			for _, headers := range []string{`{}`, ``, `{"ce-source":"/own","x":"\u0026"}`, `{"ce-time":"","ce-id":"other","ce-type":"t"}`} {
				rec := rows[0].rec
				rec.Key, rec.Headers, rec.CreatedAt, rec.Attempts = key, []byte(headers), created, 3
				rows = append(rows, struct {
					name string
					rec  postboxdriver.Record
				}{headers, rec})
			}
		}
		for _, row := range rows {
			got, err := r.envelope(&row.rec)
			if err != nil {
				t.Fatalf("%s: %v", row.name, err)
			}
			h := map[string]string{}
			if len(row.rec.Headers) > 0 {
				if err := json.Unmarshal(row.rec.Headers, &h); err != nil {
					t.Fatal(err)
				}
			}
			want := newEnvelope(row.rec.ID, row.rec.Topic, row.rec.Key, row.rec.Payload, h, r.cfg.Source, r.horizon, row.rec.CreatedAt, row.rec.Attempts+1)
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("%s: envelope\n%+v\nreference\n%+v", row.name, got, want)
			}
		}
	}
	if _, err := r0().envelope(&postboxdriver.Record{Headers: []byte(`{"a":1}`)}); !IsPermanent(err) {
		t.Fatalf("a row whose headers are not strings: %v, want a permanent error", err)
	}
}

func r0() *relay { return &relay{cfg: &Config{Source: DefaultSource}, horizon: replayHorizon(0)} }

// TestSpecial8 holds special8 to plainByte on every byte at every place
// in a word of plain bytes, and on random words.
func TestSpecial8(t *testing.T) {
	want := func(w uint64) bool {
		for i := range 8 {
			if !plainByte[byte(w>>(8*i))] {
				return true
			}
		}
		return false
	}
	check := func(w uint64) {
		if got := special8(w); got != want(w) {
			t.Fatalf("special8(%#016x) = %v, want %v", w, got, !got)
		}
	}
	for _, base := range []uint64{0x2020202020202020, 0x7e7e7e7e7e7e7e7e, 0x2323232323232323, 0x5d5d5d5d5d5d5d5d, 0x6162636465666768} {
		check(base)
		for pos := range 8 {
			for c := range 256 {
				w := base&^(0xff<<(8*pos)) | uint64(c)<<(8*pos)
				check(w)
				for pos2 := range 8 {
					check(w&^(0xff<<(8*pos2)) | uint64(0x21)<<(8*pos2))
				}
			}
		}
	}
	rng := rand.New(rand.NewPCG(5, 6))
	for range 1 << 20 {
		w := rng.Uint64()
		check(w)
		check(w &^ 0x8080808080808080)
		check(w&^0x8080808080808080 | 0x2020202020202020)
	}
}

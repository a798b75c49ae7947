package postboxdriver

import (
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"
)

// LoadMigrations reads the migrations of a dialect from dir in fsys: files
// named NNN_name.sql, whose {prefix} placeholders become prefix. It panics
// on a file that is not numbered: migrations are embedded at build time,
// so that is a bug in the build, not an input.
func LoadMigrations(fsys fs.FS, dir, prefix string) []Migration {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		panic(err)
	}
	out := make([]Migration, 0, len(entries))
	for _, e := range entries {
		name := strings.TrimSuffix(e.Name(), ".sql")
		num, rest, _ := strings.Cut(name, "_")
		v, err := strconv.Atoi(num)
		if err != nil {
			panic(fmt.Sprintf("postboxdriver: migration %s is not numbered", e.Name()))
		}
		body, err := fs.ReadFile(fsys, dir+"/"+e.Name())
		if err != nil {
			panic(err)
		}
		out = append(out, Migration{Version: v, Name: rest, SQL: strings.ReplaceAll(string(body), "{prefix}", prefix)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out
}

package postboxdriver

import (
	"crypto/md5" //nolint:gosec // a stable hash for partitioning, not security
	"encoding/binary"
)

// PartitionOf returns the partition of a row: the first four bytes of
// md5(key), or of md5(id) for a row without a key, as a non-negative int32,
// modulo n. The PostgreSQL table computes the same value in a generated
// column; drivers for databases without md5 compute it here.
func PartitionOf(key, id string, n int) int {
	s := key
	if s == "" {
		s = id
	}
	sum := md5.Sum([]byte(s)) //nolint:gosec // see above
	return int(binary.BigEndian.Uint32(sum[:4])&0x7fffffff) % n
}

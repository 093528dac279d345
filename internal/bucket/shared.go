package bucket

import (
	"hash/fnv"
	"strconv"
	"strings"
	"sync"
)

// The shared layout (LayoutShared, lua/shared.lua) keeps a bucket as a field of a hash that
// the buckets of many subjects share, "rl:{<slot tag>}:h<j>": the slot tag is a short string
// of the bucket key's own cluster slot, so that a call's keys stay in one slot, and j, below
// StoreConfig.SharedHashes, spreads a slot's buckets over that many hashes. A subject's
// buckets (one hash tag) all go to one hash.

// clusterSlots is the number of Redis Cluster hash slots.
const clusterSlots = 16384

// sharedHash returns the name of the hash that holds the bucket of key in the shared layout,
// one of perSlot (>= 1) hashes in key's cluster slot.
func sharedHash(key string, perSlot int) string {
	tag := hashTag(key)
	var b strings.Builder
	b.Grow(16)
	b.WriteString("rl:{")
	b.WriteString(slotTags()[keySlot(tag)])
	b.WriteString("}:h")
	if perSlot > 1 {
		h := fnv.New32a()
		h.Write([]byte(tag))
		b.WriteString(strconv.FormatUint(uint64(h.Sum32()%uint32(perSlot)), 10))
	}
	return b.String()
}

// hashTag returns the part of key Redis Cluster hashes: what is between the first '{' and the
// first '}' after it when that is not empty, else key.
func hashTag(key string) string {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			return key[i+1 : i+1+j]
		}
	}
	return key
}

// keySlot returns the cluster slot of a hash tag: CRC16 (XMODEM) modulo 16384, as Redis
// Cluster computes it.
func keySlot(tag string) int {
	var crc uint16
	for i := 0; i < len(tag); i++ {
		crc ^= uint16(tag[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % clusterSlots
}

// slotTags returns, per cluster slot, the shortest base-36 number whose slot it is (the first
// found counting up): a hash tag that puts a key in that slot. Computed once, in about a
// millisecond.
var slotTags = sync.OnceValue(func() *[clusterSlots]string {
	var tags [clusterSlots]string
	left := clusterSlots
	for i := uint64(0); left > 0; i++ {
		t := strconv.FormatUint(i, 36)
		if s := keySlot(t); tags[s] == "" {
			tags[s] = t
			left--
		}
	}
	return &tags
})

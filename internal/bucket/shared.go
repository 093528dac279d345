package bucket

import (
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
// one of perSlot (>= 1) hashes in key's cluster slot, chosen by the FNV-1a hash of key's hash
// tag. It allocates the name alone.
func sharedHash(key string, perSlot int) string {
	tag := hashTag(key)
	var buf [32]byte
	b := append(buf[:0], "rl:{"...)
	b = append(b, slotTags()[keySlot(tag)]...)
	b = append(b, "}:h"...)
	if perSlot > 1 {
		h := uint32(2166136261)
		for i := 0; i < len(tag); i++ {
			h = (h ^ uint32(tag[i])) * 16777619
		}
		b = strconv.AppendUint(b, uint64(h%uint32(perSlot)), 10)
	}
	return string(b)
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
		crc = crc<<8 ^ crc16Table[byte(crc>>8)^tag[i]]
	}
	return int(crc) % clusterSlots
}

// crc16Table is CRC16-XMODEM's (polynomial 0x1021) per byte.
var crc16Table = func() (t [256]uint16) {
	for i := range t {
		crc := uint16(i) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
		t[i] = crc
	}
	return t
}()

// slotTags returns, per cluster slot, the shortest base-36 number whose slot it is (the first
// found counting up, at most 4 characters): a hash tag that puts a key in that slot. Computed
// once, when first needed (about 10 ms).
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

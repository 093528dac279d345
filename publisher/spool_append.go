package publisher

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
)

// append writes a record to the buffer of the last segment, starting a new segment first
// when the record would not fit. It returns errSpoolFull when the spool would exceed
// maxBytes.
func (s *spool) append(partition int, id string, count int, data []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errSpoolClosed
	}
	h := append(s.hdr[:0], 0, 0, 0, 0, 0, 0, 0, 0) // header, filled in below
	h = binary.AppendUvarint(h, uint64(partition))
	h = binary.AppendUvarint(h, uint64(len(id)))
	h = append(h, id...)
	h = binary.AppendUvarint(h, uint64(count))
	s.hdr = h
	plen := len(h) - recHeader + len(data)
	size := int64(recHeader + plen)
	if s.total+size > s.maxBytes {
		return errSpoolFull
	}
	if last := s.segs[len(s.segs)-1]; last.size > 0 && last.size+size > s.segBytes {
		if err := s.roll(); err != nil {
			return err
		}
	}
	crc := crc32.Update(crc32.Checksum(h[recHeader:], castagnoli), castagnoli, data)
	binary.LittleEndian.PutUint32(h[0:4], uint32(plen))
	binary.LittleEndian.PutUint32(h[4:8], crc)
	if _, err := s.bw.Write(h); err != nil {
		return s.writeFailed(err)
	}
	if _, err := s.bw.Write(data); err != nil {
		return s.writeFailed(err)
	}
	s.segs[len(s.segs)-1].size += size
	s.total += size
	s.unflushed += int64(count)
	s.pending.Add(size)
	return nil
}

// writeFailed undoes the writes not yet handed to the OS, counting their decisions dropped,
// so that the segment ends with a whole record. s.mu must be held.
func (s *spool) writeFailed(err error) error {
	err = fmt.Errorf("write spool: %w", err)
	if s.unflushed > 0 {
		s.drop(s.unflushed, err.Error())
	}
	last := &s.segs[len(s.segs)-1]
	lost := last.size - s.flushed
	if terr := s.w.Truncate(s.flushed); terr != nil {
		err = errors.Join(err, fmt.Errorf("truncate spool segment: %w", terr))
	}
	s.bw.Reset(s.w)
	last.size = s.flushed
	s.total -= lost
	s.pending.Add(-lost)
	s.unflushed = 0
	return err
}

// roll fsyncs the last segment and starts the next one. s.mu must be held.
func (s *spool) roll() error {
	if err := s.flushLocked(); err != nil {
		return err
	}
	if err := s.w.Sync(); err != nil {
		s.log.Warn("spool: fsync of a full segment failed", "err", err)
	}
	id := s.segs[len(s.segs)-1].id + 1
	f, err := s.createSegment(id)
	if err != nil {
		return err
	}
	s.w.Close()
	s.w = f
	s.bw.Reset(f)
	s.flushed = 0
	s.segs = append(s.segs, segment{id: id})
	return nil
}

// flush hands the buffered writes to the OS.
func (s *spool) flush() {
	s.mu.Lock()
	s.flushLocked()
	s.mu.Unlock()
}

func (s *spool) flushLocked() error {
	size := s.segs[len(s.segs)-1].size
	if s.closed || s.flushed == size {
		return nil
	}
	if err := s.bw.Flush(); err != nil {
		return s.writeFailed(err)
	}
	s.flushed, s.unflushed = size, 0
	return nil
}

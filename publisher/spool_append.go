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
	h := appendRecordHeader(s.hdr[:0], partition, id, count, data)
	s.hdr = h
	size := int64(len(h) + len(data))
	if s.total+size > s.maxBytes {
		return errSpoolFull
	}
	if last := s.segs[len(s.segs)-1]; last.size > 0 && last.size+size > s.segBytes {
		if err := s.roll(); err != nil {
			return err
		}
	}
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

// appendRecordHeader appends the header of a record of data to h: length, CRC-32C, partition,
// message id and count. The record is the header followed by data.
func appendRecordHeader(h []byte, partition int, id string, count int, data []byte) []byte {
	start := len(h)
	h = append(h, 0, 0, 0, 0, 0, 0, 0, 0) // length and CRC, filled in below
	h = binary.AppendUvarint(h, uint64(partition))
	h = binary.AppendUvarint(h, uint64(len(id)))
	h = append(h, id...)
	h = binary.AppendUvarint(h, uint64(count))
	meta := h[start+recHeader:]
	crc := crc32.Update(crc32.Checksum(meta, castagnoli), castagnoli, data)
	binary.LittleEndian.PutUint32(h[start:start+4], uint32(len(meta)+len(data)))
	binary.LittleEndian.PutUint32(h[start+4:start+8], crc)
	return h
}

// appendRound writes records (whole encoded records, see appendRecordHeader) to the last
// segment in one write(2) and returns once the OS has them (its page cache, not the disk): a
// crash of the process can no longer lose them. It starts a new segment first when they
// would not fit. On a failure nothing of them stays in the spool, and no decision is counted
// dropped: that is the caller's to count. Writes buffered by append go first.
func (s *spool) appendRound(records []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errSpoolClosed
	}
	size := int64(len(records))
	if s.total+size > s.maxBytes {
		return errSpoolFull
	}
	if last := s.segs[len(s.segs)-1]; last.size > 0 && last.size+size > s.segBytes {
		if err := s.roll(); err != nil {
			return err
		}
	} else if err := s.flushLocked(); err != nil {
		return err
	}
	return s.writeLocked(records)
}

// mark appends a marker (a fragment record without id or decisions, see fragmentFlag) and
// hands it to the OS. It may take the spool past maxBytes by its few bytes: a spool full of
// fragments could never be published without it.
func (s *spool) mark() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errSpoolClosed
	}
	if err := s.flushLocked(); err != nil {
		return err
	}
	rec := appendRecordHeader(s.hdr[:0], fragmentFlag, "", 0, nil)
	s.hdr = rec
	return s.writeLocked(rec)
}

// writeLocked writes whole records to the last segment, bypassing the buffer, which must be
// empty. s.mu must be held.
func (s *spool) writeLocked(records []byte) error {
	if _, err := s.w.Write(records); err != nil {
		// A short write (disk full) leaves part of a record: cut it, so the segment ends with
		// a whole record for the next append and for the next start.
		err = fmt.Errorf("write spool: %w", err)
		if terr := s.w.Truncate(s.flushed); terr != nil {
			err = errors.Join(err, fmt.Errorf("truncate spool segment: %w", terr))
		}
		return err
	}
	size := int64(len(records))
	s.segs[len(s.segs)-1].size += size
	s.total += size
	s.flushed += size
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

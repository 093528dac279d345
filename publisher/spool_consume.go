package publisher

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"slices"
)

// read returns the record at p or, when p is the end of a segment, the first record of the
// next one; ok is false at the end of the spool. It hands buffered writes to the OS when it
// needs them.
func (s *spool) read(p spoolPos) (rec spoolRecord, ok bool, err error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return rec, false, nil
	}
	i, _ := slices.BinarySearchFunc(s.segs, p.seg, func(sg segment, id uint64) int {
		return cmpUint(sg.id, id)
	})
	if i == len(s.segs) {
		s.mu.Unlock()
		return rec, false, nil
	}
	if s.segs[i].id != p.seg {
		p = spoolPos{seg: s.segs[i].id}
	}
	var limit int64
	for {
		if i == len(s.segs)-1 {
			if p.off >= s.flushed {
				if err := s.flushLocked(); err != nil {
					s.mu.Unlock()
					return rec, false, nil // the failed writes are undone and counted
				}
			}
			limit = s.flushed
			if p.off >= limit {
				s.mu.Unlock()
				return rec, false, nil
			}
			break
		}
		limit = s.segs[i].size
		if p.off < limit {
			break
		}
		i++
		p = spoolPos{seg: s.segs[i].id}
	}
	f, err := s.reader(p.seg)
	s.mu.Unlock()
	if err != nil {
		return rec, false, err
	}
	b, err := s.readAhead(f, p, limit)
	if err != nil {
		return rec, false, fmt.Errorf("read spool record at %s:%d: %w", segName(p.seg), p.off, err)
	}
	n := int64(binary.LittleEndian.Uint32(b[0:4]))
	if p.off+recHeader+n > limit || recHeader+n > int64(len(b)) {
		return rec, false, fmt.Errorf("spool record at %s:%d: length %d past the end", segName(p.seg), p.off, n)
	}
	payload := b[recHeader : recHeader+n : recHeader+n]
	if crc32.Checksum(payload, castagnoli) != binary.LittleEndian.Uint32(b[4:8]) {
		return rec, false, fmt.Errorf("spool record at %s:%d: checksum mismatch", segName(p.seg), p.off)
	}
	if rec, err = parsePayload(payload); err != nil {
		return rec, false, fmt.Errorf("spool record at %s:%d: %w", segName(p.seg), p.off, err)
	}
	rec.end = spoolPos{seg: p.seg, off: p.off + recHeader + n}
	return rec, true, nil
}

// readAheadBytes is the most the replayer reads from a segment in one pread(2).
const readAheadBytes = 256 << 10

// readAhead returns the bytes of segment p.seg from p.off on, at least its record's header
// and, when the record ends before limit, the whole record: from the bytes read before when
// they hold it, else read anew, up to readAheadBytes (or the record) in one pread(2) instead
// of two per record. What was read stays true: bytes handed to the OS are never rewritten,
// and a segment's number is never reused. Each read allocates a new buffer, so the records
// returned before keep theirs. read is the replayer's alone, and so is s.ahead.
func (s *spool) readAhead(f *os.File, p spoolPos, limit int64) ([]byte, error) {
	if a := &s.ahead; a.seg == p.seg && p.off >= a.off && p.off+recHeader <= a.off+int64(len(a.buf)) {
		b := a.buf[p.off-a.off:]
		if n := int64(binary.LittleEndian.Uint32(b[0:4])); recHeader+n <= int64(len(b)) || p.off+recHeader+n > limit {
			return b, nil
		}
	}
	size := min(limit-p.off, readAheadBytes)
	if size < recHeader {
		return nil, fmt.Errorf("%d bytes left, a record header takes %d", size, recHeader)
	}
	b := make([]byte, size)
	if _, err := f.ReadAt(b, p.off); err != nil {
		return nil, err
	}
	if n := int64(binary.LittleEndian.Uint32(b[0:4])); recHeader+n > size && p.off+recHeader+n <= limit {
		b = make([]byte, recHeader+n) // a record larger than the read-ahead
		if _, err := f.ReadAt(b, p.off); err != nil {
			return nil, err
		}
	}
	s.ahead = readAheadBuf{seg: p.seg, off: p.off, buf: b}
	return b, nil
}

func cmpUint(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// reader returns a read-only file of segment id. s.mu must be held.
func (s *spool) reader(id uint64) (*os.File, error) {
	if s.rf != nil && s.rfID == id {
		return s.rf, nil
	}
	if s.rf != nil {
		s.rf.Close()
		s.rf = nil
	}
	f, err := os.Open(s.path(segName(id)))
	if err != nil {
		return nil, fmt.Errorf("open spool segment: %w", err)
	}
	s.rf, s.rfID = f, id
	return f, nil
}

// ackPos returns where the unpublished records begin.
func (s *spool) ackPos() spoolPos {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ack
}

// commit moves the cursor to p, every record before it being published, and removes the
// segments before p's.
func (s *spool) commit(p spoolPos) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.ack = p
	var gone []uint64
	for len(s.segs) > 1 && s.segs[0].id < p.seg {
		gone = append(gone, s.segs[0].id)
		s.total -= s.segs[0].size
		s.segs = s.segs[1:]
	}
	s.pending.Store(s.total - s.ack.off)
	s.dropReader(gone)
	s.mu.Unlock()
	s.remove(gone)
}

// skipSegment gives up the records of p's segment from p on: they cannot be read.
func (s *spool) skipSegment(p spoolPos) {
	s.mu.Lock()
	i := slices.IndexFunc(s.segs, func(sg segment) bool { return sg.id >= p.seg })
	if i < 0 {
		s.mu.Unlock()
		return
	}
	next := spoolPos{seg: s.segs[i].id, off: s.segs[i].size}
	if i == len(s.segs)-1 {
		s.flushLocked()
		next.off = s.segs[i].size
	}
	s.mu.Unlock()
	s.commit(next)
}

// empty reports whether every record is published.
func (s *spool) empty() bool { return s.pending.Load() == 0 }

// pendingBytes returns the size of the unpublished records.
func (s *spool) pendingBytes() int64 { return s.pending.Load() }

// compact replaces the segments by a new empty one when every record is published and they
// hold at least minBytes, so a drained spool takes no room. It reports whether it did.
func (s *spool) compact(minBytes int64) bool {
	s.mu.Lock()
	if s.closed || s.total == 0 || s.total < minBytes || s.total != s.ack.off {
		s.mu.Unlock()
		return false
	}
	id := s.segs[len(s.segs)-1].id + 1
	f, err := s.createSegment(id)
	if err != nil {
		s.mu.Unlock()
		s.log.Warn("spool: cannot start a new segment", "err", err)
		return false
	}
	gone := make([]uint64, 0, len(s.segs))
	for _, sg := range s.segs {
		gone = append(gone, sg.id)
	}
	s.w.Close()
	s.w = f
	s.bw.Reset(f)
	s.flushed, s.unflushed, s.total = 0, 0, 0
	s.segs = append(s.segs[:0], segment{id: id})
	s.ack = spoolPos{seg: id}
	s.pending.Store(0)
	s.dropReader(gone)
	s.mu.Unlock()
	s.saveCursor(false)
	s.remove(gone)
	return true
}

// dropReader closes the read side if it is one of the segments gone. s.mu must be held.
func (s *spool) dropReader(gone []uint64) {
	if s.rf != nil && slices.Contains(gone, s.rfID) {
		s.rf.Close()
		s.rf = nil
	}
}

func (s *spool) remove(gone []uint64) {
	for _, id := range gone {
		if err := os.Remove(s.path(segName(id))); err != nil && !errors.Is(err, os.ErrNotExist) {
			s.log.Warn("spool: cannot remove a published segment", "err", err)
		}
	}
}

// saveCursor writes the cursor atomically (a temporary file renamed), fsynced when sync.
func (s *spool) saveCursor(sync bool) error {
	s.cursorMu.Lock()
	defer s.cursorMu.Unlock()
	s.mu.Lock()
	p := s.ack
	s.mu.Unlock()
	if p == s.saved && !sync {
		return nil
	}
	var b [20]byte
	binary.LittleEndian.PutUint64(b[0:8], p.seg)
	binary.LittleEndian.PutUint64(b[8:16], uint64(p.off))
	binary.LittleEndian.PutUint32(b[16:20], crc32.Checksum(b[:16], castagnoli))
	tmp := s.path(cursorTmp)
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o640)
	if err != nil {
		return fmt.Errorf("write spool cursor: %w", err)
	}
	_, err = f.Write(b[:])
	if err == nil && sync {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write spool cursor: %w", err)
	}
	if err := os.Rename(tmp, s.path(cursorName)); err != nil {
		return fmt.Errorf("write spool cursor: %w", err)
	}
	if sync {
		if err := syncDir(s.dir); err != nil {
			return err
		}
	}
	s.saved = p
	return nil
}

// readCursor reads the cursor file; a missing file is the zero position.
func (s *spool) readCursor() (spoolPos, error) {
	b, err := os.ReadFile(s.path(cursorName))
	if errors.Is(err, os.ErrNotExist) {
		return spoolPos{}, nil
	}
	if err != nil {
		return spoolPos{}, fmt.Errorf("read spool cursor: %w", err)
	}
	if len(b) != 20 || crc32.Checksum(b[:16], castagnoli) != binary.LittleEndian.Uint32(b[16:20]) {
		return spoolPos{}, errors.New("spool cursor corrupt")
	}
	return spoolPos{seg: binary.LittleEndian.Uint64(b[0:8]), off: int64(binary.LittleEndian.Uint64(b[8:16]))}, nil
}

// close flushes and fsyncs the last segment, saves the cursor and releases the lock.
func (s *spool) close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	err := s.flushLocked()
	if serr := s.w.Sync(); serr != nil {
		err = errors.Join(err, fmt.Errorf("sync spool segment: %w", serr))
	}
	s.w.Close()
	if s.rf != nil {
		s.rf.Close()
		s.rf = nil
	}
	s.closed = true
	s.mu.Unlock()
	if cerr := s.saveCursor(true); cerr != nil {
		err = errors.Join(err, cerr)
	}
	s.lock.Close()
	return err
}

package publisher

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// Spool files. A segment is named after its number, zero-padded to 20 digits.
const (
	segSuffix   = ".seg"
	cursorName  = "cursor"
	cursorTmp   = "cursor.tmp"
	lockName    = "lock"
	recHeader   = 8       // uint32 payload length, uint32 CRC-32C of the payload
	maxRecord   = 1 << 30 // larger lengths are corruption
	writeBuffer = 256 << 10
)

var (
	castagnoli     = crc32.MakeTable(crc32.Castagnoli)
	errSpoolFull   = errors.New("spool full")
	errSpoolClosed = errors.New("spool closed")
)

// spoolPos is a record's position: segment number and byte offset.
type spoolPos struct {
	seg uint64
	off int64
}

// segment is a segment file and its size, including writes still buffered.
type segment struct {
	id   uint64
	size int64
}

// fragmentFlag, set in a record's partition, makes the record a fragment: part of the batch
// its message id names, whose other fragments are in other records (PublishDurable's rounds).
// A fragment without an id is a marker: every batch whose fragments came before it is whole.
// Records without the flag (the batches the queue spools, and every record of the versions
// before fragments) are whole batches.
const fragmentFlag = 1 << 24

// spoolRecord is one spooled batch, or a fragment of one.
type spoolRecord struct {
	partition int
	fragment  bool
	id        string
	count     int64
	data      []byte   // DecisionBatch bytes
	end       spoolPos // where the next record starts
}

// marker reports whether the record closes the batches of the fragments before it.
func (r *spoolRecord) marker() bool { return r.fragment && r.id == "" }

// spool is the on-disk queue of batches that could not be published: append-only segment
// files of CRC-checked records, and a cursor saying where the unpublished records begin.
// Appends come from any goroutine; reads, commits and compaction from the replayer only.
type spool struct {
	dir      string
	maxBytes int64
	segBytes int64
	log      *slog.Logger
	drop     func(n int64, why string) // decisions lost to a failed write
	lock     *os.File

	mu        sync.Mutex
	segs      []segment // ascending; the last one is written
	w         *os.File
	bw        *bufio.Writer
	flushed   int64 // bytes of the last segment handed to the OS
	unflushed int64 // decisions in records not yet handed to the OS
	total     int64 // bytes of all segment files
	ack       spoolPos
	rf        *os.File // read side of segment rfID
	rfID      uint64
	hdr       []byte
	closed    bool

	pending atomic.Int64 // bytes of unpublished records: total - ack.off
	ahead   readAheadBuf // the replayer's last read (read, readAhead)

	cursorMu sync.Mutex
	saved    spoolPos // cursor on disk
}

// readAheadBuf is bytes of segment seg from offset off on.
type readAheadBuf struct {
	seg uint64
	off int64
	buf []byte
}

func segName(id uint64) string { return fmt.Sprintf("%020d%s", id, segSuffix) }

func (s *spool) path(name string) string { return filepath.Join(s.dir, name) }

// openSpool opens the spool in dir, creating it, and takes its lock: it verifies the records
// after the cursor, cuts a torn record at the end of a segment and opens the last segment for
// appending.
func openSpool(dir string, maxBytes, segBytes int64, log *slog.Logger, drop func(int64, string)) (*spool, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("create spool dir: %w", err)
	}
	lf, err := os.OpenFile(filepath.Join(dir, lockName), os.O_CREATE|os.O_RDWR, 0o640)
	if err != nil {
		return nil, fmt.Errorf("open spool lock: %w", err)
	}
	if err := lockFile(lf); err != nil {
		lf.Close()
		return nil, fmt.Errorf("spool %s is in use by another client: %w", dir, err)
	}
	s := &spool{dir: dir, maxBytes: maxBytes, segBytes: segBytes, log: log, drop: drop, lock: lf}
	if err := s.load(); err != nil {
		if s.w != nil {
			s.w.Close()
		}
		lf.Close()
		return nil, err
	}
	return s, nil
}

// load reads the folder: segments, cursor, and the validity of the unpublished records.
func (s *spool) load() error {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return fmt.Errorf("read spool dir: %w", err)
	}
	var ids []uint64
	for _, e := range entries {
		name := e.Name()
		if name == cursorTmp {
			os.Remove(s.path(name))
			continue
		}
		num, ok := strings.CutSuffix(name, segSuffix)
		if !ok || e.IsDir() {
			continue
		}
		id, err := strconv.ParseUint(num, 10, 64)
		if err != nil || id == 0 {
			continue
		}
		ids = append(ids, id)
	}
	slices.Sort(ids)
	cur, err := s.readCursor()
	if err != nil {
		if len(ids) > 0 {
			s.log.Warn("spool cursor unreadable: replaying the spool from its first segment", "err", err)
		}
		cur = spoolPos{}
	}
	s.saved = cur
	// Segments before the cursor's are published (their removal was cut short).
	for len(ids) > 0 && ids[0] < cur.seg {
		if err := os.Remove(s.path(segName(ids[0]))); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove published spool segment: %w", err)
		}
		ids = ids[1:]
	}
	if len(ids) == 0 {
		id := max(cur.seg, 1)
		f, err := s.createSegment(id)
		if err != nil {
			return err
		}
		f.Close()
		ids = []uint64{id}
	}
	if ids[0] != cur.seg {
		cur = spoolPos{seg: ids[0]}
	}
	for i, id := range ids {
		start := int64(0)
		if id == cur.seg {
			start = cur.off
		}
		size, err := s.scanSegment(id, start, i == len(ids)-1)
		if err != nil {
			return err
		}
		if id == cur.seg && cur.off > size {
			cur.off = size
		}
		s.segs = append(s.segs, segment{id: id, size: size})
		s.total += size
	}
	last := s.segs[len(s.segs)-1]
	s.w, err = os.OpenFile(s.path(segName(last.id)), os.O_WRONLY|os.O_APPEND, 0o640)
	if err != nil {
		return fmt.Errorf("open spool segment: %w", err)
	}
	s.bw = bufio.NewWriterSize(s.w, writeBuffer)
	s.flushed = last.size
	s.ack = cur
	s.pending.Store(s.total - s.ack.off)
	return nil
}

// scanSegment verifies the records of a segment from offset start and cuts the file at the
// first bad one, returning the size that remains.
func (s *spool) scanSegment(id uint64, start int64, last bool) (int64, error) {
	name := s.path(segName(id))
	f, err := os.OpenFile(name, os.O_RDWR, 0)
	if err != nil {
		return 0, fmt.Errorf("open spool segment: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return 0, fmt.Errorf("stat spool segment: %w", err)
	}
	size := st.Size()
	if start >= size {
		return size, nil
	}
	r := bufio.NewReaderSize(io.NewSectionReader(f, start, size-start), 1<<20)
	off := start
	var hdr [recHeader]byte
	var payload []byte
	var bad error
	for off < size {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			bad = fmt.Errorf("record header: %w", err)
			break
		}
		n := int64(binary.LittleEndian.Uint32(hdr[0:4]))
		if n > maxRecord || off+recHeader+n > size {
			bad = fmt.Errorf("record of %d bytes past the end of the segment", n)
			break
		}
		payload = slices.Grow(payload[:0], int(n))[:n]
		if _, err := io.ReadFull(r, payload); err != nil {
			bad = fmt.Errorf("record payload: %w", err)
			break
		}
		if crc32.Checksum(payload, castagnoli) != binary.LittleEndian.Uint32(hdr[4:8]) {
			bad = errors.New("record checksum mismatch")
			break
		}
		if _, err := parsePayload(payload); err != nil {
			bad = err
			break
		}
		off += recHeader + n
	}
	if bad == nil {
		return size, nil
	}
	if last {
		s.log.Warn("spool: cutting a torn record at the end of the spool (a crash in mid-write)",
			"segment", name, "offset", off, "bytes", size-off, "err", bad)
	} else {
		s.log.Error("spool: corrupt record, losing the rest of its segment",
			"segment", name, "offset", off, "bytes", size-off, "err", bad)
	}
	if err := f.Truncate(off); err != nil {
		return 0, fmt.Errorf("truncate spool segment: %w", err)
	}
	if err := f.Sync(); err != nil {
		return 0, fmt.Errorf("sync spool segment: %w", err)
	}
	return off, nil
}

// parsePayload decodes a record's payload: partition (and fragmentFlag), message id, count,
// batch bytes.
func parsePayload(p []byte) (spoolRecord, error) {
	var rec spoolRecord
	part, n := binary.Uvarint(p)
	rec.fragment = part&fragmentFlag != 0
	part &^= fragmentFlag
	if n <= 0 || part > 1<<20 {
		return rec, errors.New("record partition invalid")
	}
	p = p[n:]
	idLen, n := binary.Uvarint(p)
	if n <= 0 || idLen > uint64(len(p)-n) {
		return rec, errors.New("record message id invalid")
	}
	rec.id = string(p[n : n+int(idLen)])
	p = p[n+int(idLen):]
	count, n := binary.Uvarint(p)
	if n <= 0 || count > 1<<31 {
		return rec, errors.New("record count invalid")
	}
	rec.partition, rec.count, rec.data = int(part), int64(count), p[n:]
	return rec, nil
}

// createSegment creates an empty segment file for appending and syncs the folder.
func (s *spool) createSegment(id uint64) (*os.File, error) {
	f, err := os.OpenFile(s.path(segName(id)), os.O_WRONLY|os.O_CREATE|os.O_EXCL|os.O_APPEND, 0o640)
	if err != nil {
		return nil, fmt.Errorf("create spool segment: %w", err)
	}
	if err := syncDir(s.dir); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open spool dir: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync spool dir: %w", err)
	}
	return nil
}

package telemetry

import (
	"io"
	"log/slog"

	"github.com/quotaflow/quotaflow/internal/field"
)

// NewLogger returns the logger of a process writing to w: level is slog's (debug, info, warn
// or error), format text or json. Its errors are *field.Errors naming LogLevel or LogFormat.
func NewLogger(level, format string, w io.Writer) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, &field.Error{Field: "LogLevel", Msg: err.Error(), Err: err}
	}
	opts := &slog.HandlerOptions{Level: l}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, field.Errorf("LogFormat", "want text or json, got %q", format)
}

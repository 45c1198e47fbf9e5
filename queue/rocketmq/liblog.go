package rocketmq

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"reflect"
	"slices"
	"sync"

	"github.com/apache/rocketmq-client-go/v2/rlog"
)

// libraryLoggerOnce guards the library's logger. rlog keeps one logger for
// the whole process in a package variable; this is the one piece of
// package-level state here, forced by the library: the first New installs the
// adapter and later calls leave it alone, so the library's lines always go
// to one place.
var libraryLoggerOnce sync.Once

func installLibraryLogger(log *slog.Logger, level slog.Level) {
	libraryLoggerOnce.Do(func() {
		rlog.SetLogger(libraryLogger{log: log.With("library", "rocketmq-client-go"), level: level})
	})
}

// libraryLogger adapts slog to rlog.Logger.
type libraryLogger struct {
	log   *slog.Logger
	level slog.Level
}

var _ rlog.Logger = libraryLogger{}

func (l libraryLogger) Debug(msg string, fields map[string]any) { l.emit(slog.LevelDebug, msg, fields) }
func (l libraryLogger) Info(msg string, fields map[string]any)  { l.emit(slog.LevelInfo, msg, fields) }
func (l libraryLogger) Warning(msg string, fields map[string]any) {
	l.emit(slog.LevelWarn, msg, fields)
}
func (l libraryLogger) Error(msg string, fields map[string]any) { l.emit(slog.LevelError, msg, fields) }

// Fatal logs at error level. logrus, the library's default, would exit the
// process; a client library must not take a service down.
func (l libraryLogger) Fatal(msg string, fields map[string]any) { l.emit(slog.LevelError, msg, fields) }

// Level is ignored: the level is set when the adapter is installed.
func (l libraryLogger) Level(string) {}

// OutputPath is ignored: output goes wherever the slog handler writes.
func (l libraryLogger) OutputPath(string) error { return nil }

// bulkyFields carry whole messages (bodies included, i.e. shoppers' requests);
// the adapter logs only how many there were.
var bulkyFields = map[string]bool{"messages": true, "message": true}

func (l libraryLogger) emit(level slog.Level, msg string, fields map[string]any) {
	if level < l.level || !l.log.Enabled(context.Background(), level) {
		return
	}
	attrs := make([]any, 0, 2*len(fields))
	for _, k := range slices.Sorted(maps.Keys(fields)) {
		v := fields[k]
		if bulkyFields[k] {
			v = summarize(v)
		}
		attrs = append(attrs, k, v)
	}
	l.log.Log(context.Background(), level, msg, attrs...)
}

// summarize replaces a message or message list by what it is.
func summarize(v any) any {
	if rv := reflect.ValueOf(v); rv.Kind() == reflect.Slice {
		return fmt.Sprintf("%d messages", rv.Len())
	}
	return fmt.Sprintf("(%T omitted)", v)
}

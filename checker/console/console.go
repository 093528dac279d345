// Package console serves quotaflow's web console: static pages (plain JavaScript, uPlot for
// the charts) embedded in the binary, so that `go build` alone gives a working console. The
// pages hold no secret and no data: everything they show comes from the admin API with the
// token the user signs in with, so a read token sees and a write token also changes, and every
// change is audited as any admin API call. Mount Handler at Path on the admin API's port.
package console

import (
	"embed"
	"io/fs"
	"net/http"
)

// Path is where the console is served.
const Path = "/console/"

//go:embed static
var files embed.FS

// Handler serves the console under Path, and redirects Path without its slash to it.
func Handler() http.Handler {
	sub, _ := fs.Sub(files, "static") // static is embedded: it is there
	static := http.StripPrefix(Path, http.FileServerFS(sub))
	mux := http.NewServeMux()
	mux.Handle("GET "+Path, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The pages change with the binary, and are small: always revalidated, never stale.
		w.Header().Set("Cache-Control", "no-cache")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("Content-Security-Policy", "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' blob: data:; frame-ancestors 'none'")
		w.Header().Set("Referrer-Policy", "no-referrer")
		static.ServeHTTP(w, r)
	}))
	mux.Handle("GET "+Path[:len(Path)-1], http.RedirectHandler(Path, http.StatusMovedPermanently))
	return mux
}

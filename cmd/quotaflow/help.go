package main

import (
	"embed"
	"strings"
)

// The commands' long descriptions and the top-level usage are documentation: they live in
// help/*.txt, edited as text, and the help tests check what they say.
//
//go:embed help/*.txt
var helpFiles embed.FS

// help is the text of help/<name>.txt without its last newline: a command's description
// (name is its words joined by '-': rules-apply), or "quotaflow", the top-level usage.
func help(name string) string {
	b, err := helpFiles.ReadFile("help/" + name + ".txt")
	if err != nil {
		panic("cmd/quotaflow: no help/" + name + ".txt") // a file the build embeds, or a typo
	}
	return strings.TrimSuffix(string(b), "\n")
}

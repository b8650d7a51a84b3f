package dashboard

import (
	"crypto/rand"
	"embed"
	"encoding/base64"
	"html/template"
	"strings"
)

//go:embed page.html
var pageFS embed.FS

// pages are the overview and identity templates. html/template escapes every value by
// its context (text, attribute, URL, script), so identities, which clients choose,
// render as text; CSS classes and SVG numbers are computed here, never taken from a
// report.
var pages = template.Must(template.New("").Funcs(template.FuncMap{
	"css": func() template.CSS { return template.CSS(css()) },
}).ParseFS(pageFS, "page.html"))

// nonce is a fresh Content-Security-Policy nonce for the page's one inline script.
func nonce() string {
	b := make([]byte, 16)
	rand.Read(b)                                   // never fails (crypto/rand)
	return base64.RawURLEncoding.EncodeToString(b) // no character html/template would escape
}

func css() string {
	var b strings.Builder
	for i, c := range palette {
		b.WriteString(".r" + string(rune('0'+i)) + "{stroke:" + c + ";fill:" + c + "}")
		b.WriteString(".sw.r" + string(rune('0'+i)) + "{background:" + c + "}")
	}
	return b.String()
}

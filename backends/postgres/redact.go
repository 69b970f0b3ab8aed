package postgres

import (
	"net/url"
	"strings"
)

// Redact returns a connection string with its password replaced by xxxxx,
// for /proc/mounts, .stats and logs. It reads the string the way pgx does
// (pgconn.ParseConfig): a postgres:// or postgresql:// URL (the password in
// the user info or as ?password=), or key=value pairs, where spaces may
// stand around the '=' and a value may be 'quoted' with \' and \\ escapes.
// What it cannot read is hidden whole when it mentions a password. The
// connection string of session_url, inside it, is redacted the same way.
func Redact(conn string) string {
	if isURL(conn) {
		return redactURL(conn)
	}
	out, ok := walkKeywords(conn, func(key, raw string) string {
		switch key {
		case "password":
			return "xxxxx"
		case sessionKey:
			return quoteKeyword(Redact(unquoteKeyword(raw)))
		}
		return raw
	})
	if !ok {
		if strings.Contains(strings.ToLower(conn), "password") {
			return "(a connection string with a password)"
		}
		return conn
	}
	return out
}

func redactURL(conn string) string {
	u, err := url.Parse(conn)
	if err != nil {
		// pgx cannot use it either; still never show what could be a
		// password: drop the user info and the query.
		rest := conn[strings.Index(conn, "://")+3:]
		if at := strings.LastIndex(rest, "@"); at >= 0 {
			rest = "xxxxx@" + rest[at+1:]
		}
		if q := strings.IndexByte(rest, '?'); q >= 0 {
			rest = rest[:q] + "?xxxxx"
		}
		return conn[:strings.Index(conn, "://")+3] + rest
	}
	if u.User != nil {
		if _, has := u.User.Password(); has {
			u.User = url.UserPassword(u.User.Username(), "xxxxx")
		}
	}
	if q, err := url.ParseQuery(u.RawQuery); err != nil {
		if strings.Contains(strings.ToLower(u.RawQuery), "password") {
			u.RawQuery = "xxxxx"
		}
	} else if q.Has("password") || q.Has(sessionKey) {
		if q.Has("password") {
			q.Set("password", "xxxxx")
		}
		if q.Has(sessionKey) {
			q.Set(sessionKey, Redact(q.Get(sessionKey)))
		}
		u.RawQuery = q.Encode()
	}
	return u.String()
}

func isURL(conn string) bool {
	return strings.HasPrefix(conn, "postgres://") || strings.HasPrefix(conn, "postgresql://")
}

// walkSettings calls fn with every setting of a connection string that
// it can read (the query of a URL; key=value pairs), values unquoted.
func walkSettings(conn string, fn func(key, value string)) {
	if isURL(conn) {
		u, err := url.Parse(conn)
		if err != nil {
			return
		}
		q, _ := url.ParseQuery(u.RawQuery)
		for k, vs := range q {
			for _, v := range vs {
				fn(k, v)
			}
		}
		return
	}
	walkKeywords(conn, func(key, raw string) string {
		fn(key, unquoteKeyword(raw))
		return raw
	})
}

const kwSpace = " \t\n\r\v\f"

// walkKeywords walks key=value pairs exactly as pgconn does and replaces
// each value, as it stands (quoted or not), by what fn returns for it. ok
// is false when the string is not one pgconn would parse.
func walkKeywords(s string, fn func(key, raw string) string) (string, bool) {
	var b strings.Builder
	for len(strings.TrimLeft(s, kwSpace)) > 0 {
		eq := strings.IndexByte(s, '=')
		if eq < 0 {
			return "", false
		}
		key := strings.Trim(s[:eq], kwSpace)
		b.WriteString(s[:eq+1])
		s = s[eq+1:]
		rest := strings.TrimLeft(s, kwSpace)
		b.WriteString(s[:len(s)-len(rest)])
		s = rest
		end := 0 // the value is s[:end]
		if len(s) > 0 && s[0] == '\'' {
			end = 1
			for ; end < len(s) && s[end] != '\''; end++ {
				if s[end] == '\\' {
					end++
				}
			}
			if end >= len(s) {
				return "", false // unterminated quote
			}
			end++ // the closing quote
		} else {
			for ; end < len(s) && !strings.ContainsRune(kwSpace, rune(s[end])); end++ {
				if s[end] == '\\' {
					end++
					if end == len(s) {
						return "", false
					}
				}
			}
		}
		b.WriteString(fn(key, s[:end]))
		s = s[end:]
	}
	b.WriteString(s)
	return b.String(), true
}

// unquoteKeyword is the value of a key=value pair as it stands: without
// its quotes, if quoted, and its backslash escapes undone.
func unquoteKeyword(raw string) string {
	if len(raw) >= 2 && raw[0] == '\'' && raw[len(raw)-1] == '\'' {
		raw = raw[1 : len(raw)-1]
	}
	var b strings.Builder
	for i := 0; i < len(raw); i++ {
		if raw[i] == '\\' && i+1 < len(raw) {
			i++
		}
		b.WriteByte(raw[i])
	}
	return b.String()
}

// quoteKeyword quotes v as the value of a key=value pair.
func quoteKeyword(v string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(v) + "'"
}

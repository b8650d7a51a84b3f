package configs

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// metricNames returns the metric names a PromQL expression selects, sorted and unique.
//
// Why not Prometheus's own parser (github.com/prometheus/prometheus/promql/parser): it is
// the prometheus/prometheus module, whose go.mod pulls a few hundred modules into our
// go.sum (Kubernetes and cloud discovery clients included) for one test. Names are all this
// test needs, and PromQL's lexical structure makes them easy to find without a grammar.
// A name is an identifier ([a-zA-Z_:][a-zA-Z0-9_:]*) that is not
//
//   - inside a string ("…", '…', `…`), a comment (# to the end of the line), label
//     matchers ({…}), or a range or subquery ([…]);
//   - a label list: the parenthesised list after by, without, on, ignoring, group_left,
//     group_right;
//   - a keyword or operator word (and, or, unless, offset, bool, atan2, inf, nan, @ start(),
//     end()), an aggregation operator (sum, topk, …) or a function (any identifier
//     followed by "(");
//   - part of a number or duration (1e-3, 0x1f, 5m, 1h30m);
//   - a Grafana variable ($var, ${var}, ${var:format}, [[var]]).
//
// An expression that selects by {__name__=…} is an error: the names must be visible.
// Unbalanced brackets and unterminated strings are errors too, so a typo cannot hide a
// name from the check.
func metricNames(expr string) ([]string, error) {
	var names []string
	s := expr
	depth := 0 // parentheses, for the label-list state
	type listState int
	const (
		none   listState = iota
		want             // the last word was by/without/on/ignoring/group_x: a label list may follow
		inList           // inside that list, which closes at listDepth
	)
	state, listDepth := none, 0
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
			continue
		case c == '#':
			for i < len(s) && s[i] != '\n' {
				i++
			}
			continue
		case c == '"' || c == '\'' || c == '`':
			j, err := skipString(s, i)
			if err != nil {
				return nil, err
			}
			i = j
			state = none
			continue
		case c == '$':
			i = skipVariable(s, i)
			state = none
			continue
		case c == '{':
			j, body, err := skipBracket(s, i, '{', '}')
			if err != nil {
				return nil, err
			}
			if strings.Contains(body, "__name__") {
				return nil, fmt.Errorf("promql %q: selects by __name__; write the metric name", expr)
			}
			i = j
			state = none
			continue
		case c == '[':
			if strings.HasPrefix(s[i:], "[[") { // Grafana's old [[var]]
				k := strings.Index(s[i:], "]]")
				if k < 0 {
					return nil, fmt.Errorf("promql %q: unterminated [[variable]]", expr)
				}
				i += k + 2
				continue
			}
			j, _, err := skipBracket(s, i, '[', ']')
			if err != nil {
				return nil, err
			}
			i = j
			continue
		case c == '(':
			depth++
			if state == want {
				state, listDepth = inList, depth
			}
			i++
			continue
		case c == ')':
			if depth == 0 {
				return nil, fmt.Errorf("promql %q: unbalanced )", expr)
			}
			if state == inList && depth == listDepth {
				state = none
			}
			depth--
			i++
			continue
		case c == '}' || c == ']':
			return nil, fmt.Errorf("promql %q: unbalanced %c", expr, c)
		case isDigit(c) || (c == '.' && i+1 < len(s) && isDigit(s[i+1])):
			i = skipNumber(s, i)
			state = none
			continue
		case isIdentStart(c):
			j := i
			for j < len(s) && isIdentChar(s[j]) {
				j++
			}
			word := s[i:j]
			i = j
			if state == inList { // a label name
				continue
			}
			lw := strings.ToLower(word)
			switch lw {
			case "by", "without", "on", "ignoring", "group_left", "group_right":
				state = want
				continue
			case "and", "or", "unless", "offset", "bool", "atan2", "inf", "nan", "start", "end", "step":
				state = none
				continue
			}
			state = none
			if aggregations[lw] || nextNonSpace(s, i) == '(' {
				continue // an aggregation or a function
			}
			names = append(names, word)
			continue
		default: // operators, commas, @
			if state == want {
				state = none
			}
			i++
			continue
		}
	}
	if depth != 0 {
		return nil, fmt.Errorf("promql %q: unbalanced (", expr)
	}
	slices.Sort(names)
	return slices.Compact(names), nil
}

var aggregations = map[string]bool{
	"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true,
	"stdvar": true, "count": true, "count_values": true, "bottomk": true, "topk": true,
	"quantile": true, "limitk": true, "limit_ratio": true,
}

func isDigit(c byte) bool      { return c >= '0' && c <= '9' }
func isIdentStart(c byte) bool { return c == '_' || c == ':' || (c|0x20 >= 'a' && c|0x20 <= 'z') }
func isIdentChar(c byte) bool  { return isIdentStart(c) || isDigit(c) }

func nextNonSpace(s string, i int) byte {
	for ; i < len(s); i++ {
		if c := s[i]; c != ' ' && c != '\t' && c != '\n' && c != '\r' {
			return c
		}
	}
	return 0
}

// skipString returns the index after the string starting at s[i].
func skipString(s string, i int) (int, error) {
	q := s[i]
	for j := i + 1; j < len(s); j++ {
		switch {
		case s[j] == '\\' && q != '`':
			j++
		case s[j] == q:
			return j + 1, nil
		}
	}
	return 0, fmt.Errorf("promql %q: unterminated string", s)
}

// skipBracket returns the index after the bracket opened at s[i], and what it enclosed;
// strings inside may hold the closing bracket.
func skipBracket(s string, i int, open, close byte) (int, string, error) {
	for j := i + 1; j < len(s); j++ {
		switch s[j] {
		case '"', '\'', '`':
			k, err := skipString(s, j)
			if err != nil {
				return 0, "", err
			}
			j = k - 1
		case open:
			return 0, "", fmt.Errorf("promql %q: nested %c", s, open)
		case close:
			return j + 1, s[i+1 : j], nil
		}
	}
	return 0, "", fmt.Errorf("promql %q: unterminated %c", s, open)
}

// skipVariable returns the index after a Grafana variable at s[i] ($x or ${x…}).
func skipVariable(s string, i int) int {
	if i+1 < len(s) && s[i+1] == '{' {
		if k := strings.IndexByte(s[i:], '}'); k >= 0 {
			return i + k + 1
		}
		return len(s)
	}
	j := i + 1
	for j < len(s) && isIdentChar(s[j]) {
		j++
	}
	return j
}

// skipNumber returns the index after a number or duration at s[i]: digits, letters (hex,
// units, exponent markers), dots, and a sign right after an exponent's e.
func skipNumber(s string, i int) int {
	j := i
	for j < len(s) {
		c := s[j]
		switch {
		case isIdentChar(c) || c == '.':
			j++
		case (c == '+' || c == '-') && (s[j-1] == 'e' || s[j-1] == 'E') && !strings.HasPrefix(s[i:], "0x") &&
			j+1 < len(s) && isDigit(s[j+1]):
			j++
		default:
			return j
		}
	}
	return j
}

func TestMetricNames(t *testing.T) {
	for _, tc := range []struct {
		expr string
		want []string
	}{
		{`up`, []string{"up"}},
		{`rate(allot_a_total[5m])`, []string{"allot_a_total"}},
		{`sum by (region, le) (rate(allot_check_seconds_bucket{region=~"$region", job="x"}[$__rate_interval]))`,
			[]string{"allot_check_seconds_bucket"}},
		{`histogram_quantile(0.99, sum without(instance) (rate(h_bucket[5m]))) > 2e-3`, []string{"h_bucket"}},
		{`a / on(region) group_left(version) b`, []string{"a", "b"}},
		{`a * ignoring (shard) group_right c`, []string{"a", "c"}},
		{`count by (region, shard) (allot_breaker >= 1) / on (region) group_left count by (region) (allot_rules) > 0.1`,
			[]string{"allot_breaker", "allot_rules"}},
		{`x offset 1w and y @ start() unless z @ 1609746000`, []string{"x", "y", "z"}},
		{`topk(5, sum by (plan) (rate(p_total{result="refused"}[1h] offset 1w)))`, []string{"p_total"}},
		{`label_replace(m, "dst", "$1", "src", "(.*)")`, []string{"m"}},
		{`max_over_time(m[10m:1m]) - 1.5e+3 + 0x1F * Inf + NaN`, []string{"m"}},
		{`m{name="a}b", other='c\'d'} # a comment naming notametric`, []string{"m"}},
		{`absent(allot_balancer_leader{region="us-east"}) or vector(0)`, []string{"allot_balancer_leader"}},
		{`ns:recorded:rate5m > bool 1`, []string{"ns:recorded:rate5m"}},
		{`sum(rate(a[${__range}])) / ignoring(x)group_left sum(b) by (y)`, []string{"a", "b"}},
		{`sum(a) by (region) / count(b) without (instance, job)`, []string{"a", "b"}},
		{`count_values("version", allot_enforcer_rules_info)`, []string{"allot_enforcer_rules_info"}},
		{`time() - m > 60`, []string{"m"}},
		{`[[interval]] m`, []string{"m"}},
	} {
		got, err := metricNames(tc.expr)
		if err != nil {
			t.Errorf("%s: %v", tc.expr, err)
			continue
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: got %q, want %q", tc.expr, got, tc.want)
		}
	}
}

func TestMetricNamesRefusesWhatItCannotSee(t *testing.T) {
	for _, expr := range []string{
		`{__name__="allot_x"}`,
		`sum(rate(a[5m])`,
		`a)`,
		`a{x="y"`,
		`a{x="y}`,
		`rate(a[5m)`,
		`a}`,
	} {
		if got, err := metricNames(expr); err == nil {
			t.Errorf("%s: got %q and no error", expr, got)
		}
	}
}

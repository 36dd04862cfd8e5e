package main

import (
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"
)

// lineWidth is the width a table must fit in: man(1)'s 80 columns less the
// section's indent (7).
const lineWidth = 73

// tablePattern finds the tbl tables go-md2man writes: .TS, the options line
// (allbox;), one format line per row kind, the last ending in '.', the rows,
// .TE.
var tablePattern = regexp.MustCompile(`(?s)\.TS\n([^\n]*;)\n((?:[^\n]*\n)*?[^\n]*\.)\n(.*?)\n\.TE`)

// fitTables rewrites every table of roff wider than lineWidth so that it fits:
// go-md2man gives each column its text's natural width, so a table with a
// sentence in a cell ran to 180 columns. Each column gets at least its
// longest word (a name breaks after its underscores) and at most its longest
// cell; a column given less than its
// longest cell gets a width (lw) and its cells become text blocks (T{ T}),
// which tbl fills to that width.
func fitTables(roff []byte) []byte {
	return tablePattern.ReplaceAllFunc(roff, func(table []byte) []byte {
		m := tablePattern.FindSubmatch(table)
		rows := tableRows(string(m[3]))
		widths, fits := fitColumns(rows)
		if fits {
			return table
		}
		var b strings.Builder
		b.WriteString(".TS\n" + string(m[1]) + "\n")
		format := make([]string, len(widths))
		for k, w := range widths {
			format[k] = "l"
			if w > 0 {
				format[k] = "lw(" + strconv.Itoa(w) + "n)"
			}
		}
		b.WriteString(strings.Join(format, " ") + " .\n")
		for _, row := range rows {
			for k, cell := range row {
				if k > 0 {
					b.WriteByte('\t')
				}
				if k < len(widths) && widths[k] > 0 {
					// \: lets troff break a long name after its underscores.
					b.WriteString("T{\n" + strings.ReplaceAll(cell, "_", `_\:`) + "\nT}")
				} else {
					b.WriteString(cell)
				}
			}
			b.WriteByte('\n')
		}
		b.WriteString(".TE")
		return []byte(b.String())
	})
}

// tableRows splits tbl rows into cells: tab-separated, a T{ … T} text block
// being one cell over several lines.
func tableRows(body string) [][]string {
	var rows [][]string
	var row []string
	var block *strings.Builder
	for _, line := range strings.Split(body, "\n") {
		if block != nil {
			rest, end := strings.CutPrefix(line, "T}")
			if !end {
				if block.Len() > 0 {
					block.WriteByte(' ')
				}
				block.WriteString(line)
				continue
			}
			row = append(row, block.String())
			block = nil
			if rest == "" {
				rows, row = append(rows, row), nil
				continue
			}
			line = strings.TrimPrefix(rest, "\t")
		}
		cells := strings.Split(line, "\t")
		if last := cells[len(cells)-1]; last == "T{" {
			row = append(row, cells[:len(cells)-1]...)
			block = &strings.Builder{}
			continue
		}
		rows, row = append(rows, append(row, cells...)), nil
	}
	return rows
}

// fitColumns gives each column of rows a width: 0 for a column that keeps its
// natural width, else the width to fill its cells to. fits says the table fits
// as it is.
func fitColumns(rows [][]string) (widths []int, fits bool) {
	var natural, least []int
	for _, row := range rows {
		for k, cell := range row {
			if k == len(natural) {
				natural, least = append(natural, 0), append(least, 0)
			}
			text := visible(cell)
			natural[k] = max(natural[k], utf8.RuneCountInString(text))
			// A cell wraps at blanks, and a name also after its underscores.
			for _, word := range strings.Fields(strings.ReplaceAll(text, "_", "_ ")) {
				least[k] = max(least[k], utf8.RuneCountInString(word))
			}
		}
	}
	room := lineWidth - 3*len(natural) - 1 // borders and padding
	total := 0
	for _, n := range natural {
		total += n
	}
	if total <= room {
		return nil, true
	}
	alloc := append([]int(nil), least...)
	left := room
	for _, a := range alloc {
		left -= a
	}
	// Hand out what is left a column at a time, to the narrowest column that
	// still lacks room: the columns that must wrap end up alike in width.
	for ; left > 0; left-- {
		best := -1
		for k := range alloc {
			if alloc[k] < natural[k] && (best < 0 || alloc[k] < alloc[best]) {
				best = k
			}
		}
		if best < 0 {
			break
		}
		alloc[best]++
	}
	widths = make([]int, len(alloc))
	for k := range alloc {
		if alloc[k] < natural[k] {
			widths[k] = alloc[k]
		}
	}
	return widths, false
}

// fontEscape matches roff's font changes, which take no room.
var fontEscape = regexp.MustCompile(`\\f(\[[^\]]*\]|\(..|.)`)

// visible is a cell's text as it is printed, near enough to measure it: no
// font changes, \- and \e as one character each.
func visible(cell string) string {
	text := fontEscape.ReplaceAllString(cell, "")
	return strings.NewReplacer(`\-`, "-", `\e`, `\`, `\&`, "", `\(em`, "-", `\(en`, "-").Replace(text)
}

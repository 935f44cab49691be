# SPDX-License-Identifier: MIT
# Prints libpinbroker(3)'s function reference, in roff, from the doc comments of pinbroker.h:
#   awk -v template=libpinbroker.3.in -f gen-api-man.awk client/lib/pinbroker.h > libpinbroker.3
# prints the template with its marker lines filled in: `.\" pinbroker.h: functions` becomes the
# reference, `.\" pinbroker.h: comment TITLE` the header comment whose first line is TITLE (less
# that line). Without -v template, just the reference.
# POSIX awk (mawk, gawk, busybox): a plain build has no python.
#
# A group is a comment followed, with no blank line between, by declarations: function
# prototypes (possibly over several lines), typedefs and #defines. Each group that declares a
# function becomes one .SS entry: its prototypes (and the typedefs and #defines among them) in
# bold, no-fill, then the comment as paragraphs. A comment followed by a blank line, a struct or
# an enum documents no function and is left out, as are struct and enum bodies. A function with
# no comment of its own joins the group of the declaration right above it; a function with none
# at all still gets an entry (and the build warns), so that no public function is ever missing.
# In the comment text: a blank comment line starts a paragraph, lines indented two spaces or
# more are kept as they are (code, errno lists), `code` and the names of pb_* functions and
# PB_* constants are set in bold, and never hyphenated.

function flush_group(   i) {
	if (nfunc > 0) {
		ngroups++
		G_names[ngroups] = funcs
		G_ncode[ngroups] = ncode
		for (i = 1; i <= ncode; i++)
			G_code[ngroups, i] = code[i]
		G_ntext[ngroups] = ntext
		for (i = 1; i <= ntext; i++)
			G_text[ngroups, i] = text[i]
	}
	nfunc = 0; funcs = ""; ncode = 0; ntext = 0
}

# A comment line's text: without "/*", "*/" and the leading " * ".
function comment_text(s) {
	sub(/^[ \t]*\/\*+/, "", s)
	sub(/^[ \t]*\*+\/?/, "", s)
	sub(/[ \t]*\*\/[ \t]*$/, "", s)
	sub(/^ /, "", s)
	sub(/[ \t]+$/, "", s)
	return s
}

function add_text(s) { text[++ntext] = s }

# Keep every top-level comment by its first line, for the template's prose markers.
function save_comment(   i) {
	if (ntext == 0) return
	C_n[text[1]] = ntext
	for (i = 1; i <= ntext; i++)
		C_text[text[1], i] = text[i]
}

function expand_tabs(s,   out, c, i) {
	out = ""
	for (i = 1; i <= length(s); i++) {
		c = substr(s, i, 1)
		if (c == "\t") {
			out = out " "
			while (length(out) % 8)
				out = out " "
		} else
			out = out c
	}
	return out
}

# A declaration as one line, then broken after commas to fit, continuation lines aligned after "(".
function wrap_decl(s,   out, col, indent, p, piece, pad) {
	gsub(/[ \t]+/, " ", s)
	sub(/^ /, "", s); sub(/ $/, "", s)
	gsub(/\( /, "(", s); gsub(/ \)/, ")", s)
	if (length(s) <= WIDTH)
		return s
	p = index(s, "(")
	if (substr(s, 1, 8) == "typedef ")
		p = index(substr(s, p + 1), "(") + p
	indent = p
	pad = sprintf("%" indent "s", "")
	out = ""; col = 0
	while ((p = index(s, ", ")) > 0) {
		piece = substr(s, 1, p)
		s = substr(s, p + 2)
		if (col > 0 && col + 1 + length(piece) > WIDTH) {
			out = out "\n" pad
			col = indent
		} else if (col > 0) {
			out = out " "
			col++
		}
		out = out piece
		col += length(piece)
	}
	if (col + 1 + length(s) > WIDTH)
		out = out "\n" pad s
	else
		out = out " " s
	return out
}

# Escapes for roff: backslashes, then hyphens (\- is what a reader can copy into a shell or a
# program: option names, config keys, errnos).
function roff_escape(s) {
	gsub(/\\/, "\\e", s)
	gsub(/-/, "\\-", s)
	return s
}

# A line may not start with a control character ("." or "'").
function guard(s) {
	if (s ~ /^[.']/)
		s = "\\&" s
	return s
}

# Bold: `code`, the names of the header's functions, and PB_ constants.
function markup(s,   out, w) {
	out = ""
	while (match(s, /`[^`]+`/)) {
		out = out substr(s, 1, RSTART - 1) "\\fB" substr(s, RSTART + 1, RLENGTH - 2) "\\fP"
		s = substr(s, RSTART + RLENGTH)
	}
	s = out s
	out = ""
	while (match(s, /[A-Za-z0-9_]*(pb|PB)_[A-Za-z0-9_]+/)) {
		w = substr(s, RSTART, RLENGTH)
		out = out substr(s, 1, RSTART - 1)
		if (is_func[w] || w ~ /^PB_[A-Z0-9_]+$/)
			out = out "\\fB" w "\\fP"
		else
			out = out w
		s = substr(s, RSTART + RLENGTH)
	}
	return nohyphen(out s)
}

# \% at the start of each word holding a name: groff neither hyphenates nor breaks it (a \% inside
# a word would be a break point instead).
function nohyphen(s,   n, i, w, out) {
	n = split(s, w, /[ ]/)
	out = ""
	for (i = 1; i <= n; i++) {
		if (w[i] ~ /(pb|PB)_/)
			w[i] = "\\%" w[i]
		out = out (i > 1 ? " " : "") w[i]
	}
	return out
}

# Prints T[first..n] as roff: paragraphs, "- " bullets (continued by lines indented two
# spaces), and lines indented two spaces or more outside a bullet kept as they are.
function emit_lines(first, n,   i, s, pre, bullet, pending_pp) {
	pre = 0; bullet = 0; pending_pp = 1
	for (i = first; i <= n; i++) {
		s = T[i]
		if (s == "") {
			if (pre) { print ".fi"; print ".RE"; pre = 0 }
			bullet = 0; pending_pp = 1
			continue
		}
		if (s ~ /^- /) {
			if (pre) { print ".fi"; print ".RE"; pre = 0 }
			print ".IP \\(bu 2"
			s = substr(s, 3)
			bullet = 1; pending_pp = 0
		} else if (bullet && s ~ /^  [^ ]/) {
			s = substr(s, 3)
		} else if (s ~ /^  /) {
			if (!pre) {
				print (bullet ? ".IP" : ".PP"); print ".RS 4"; print ".nf"
				pre = 1; pending_pp = 0
			}
			print guard(markup(roff_escape(expand_tabs(s))))
			continue
		} else if (pre) {
			print ".fi"; print ".RE"; pre = 0; pending_pp = !bullet
		}
		if (pending_pp) { print (bullet ? ".IP" : ".PP"); pending_pp = 0 }
		print guard(markup(roff_escape(s)))
	}
	if (pre) { print ".fi"; print ".RE" }
}

function print_functions(   g, i, j, n, lines) {
	for (g = 1; g <= ngroups; g++) {
		print ".SS \"" G_names[g] "\""
		print ".nf"
		for (i = 1; i <= G_ncode[g]; i++) {
			n = split(G_code[g, i], lines, "\n")
			for (j = 1; j <= n; j++)
				print guard("\\fB" roff_escape(expand_tabs(lines[j])) "\\fP")
		}
		print ".fi"
		if (G_ntext[g] == 0)
			print "gen-api-man.awk: warning: " G_names[g] " has no doc comment in " FILENAME > "/dev/stderr"
		for (i = 1; i <= G_ntext[g]; i++)
			T[i] = G_text[g, i]
		emit_lines(1, G_ntext[g])
	}
}

# A header comment named by its first line (a title), without that line.
function print_comment(key,   i) {
	if (!(key in C_n)) {
		print "gen-api-man.awk: " template " asks for the comment \"" key "\", which " FILENAME " lacks" > "/dev/stderr"
		exit 1
	}
	for (i = 1; i <= C_n[key]; i++)
		T[i] = C_text[key, i]
	emit_lines(2, C_n[key])
}

BEGIN {
	WIDTH = 70
	MARK = ".\\\" pinbroker.h: "
	depth = 0; incomment = 0; skipcomment = 0; indefine = 0; decl = ""
	nfunc = 0; ncode = 0; ntext = 0; ngroups = 0
}

# Inside a struct's or enum's comment: skip to its end.
skipcomment {
	if (index($0, "*/")) skipcomment = 0
	next
}

# A doc comment, continued.
incomment {
	add_text(comment_text($0))
	if (index($0, "*/")) { incomment = 0; save_comment() }
	next
}

# A #define continued with a backslash.
indefine {
	code[++ncode] = $0
	if ($0 !~ /\\$/) indefine = 0
	next
}

# A comment that starts a line.
/^[ \t]*\/\*/ {
	if (depth > 0) {
		if (!index($0, "*/")) skipcomment = 1
		next
	}
	# A new comment closes the group above; a comment that stops short of a declaration
	# (comments in a row) is dropped for the next one.
	if (nfunc > 0 || ncode > 0 || decl != "")
		flush_group()
	ntext = 0
	if ($0 ~ /^[ \t]*\/\*+[ \t]*$/) {
		incomment = 1
	} else {
		add_text(comment_text($0))
		if (!index($0, "*/")) incomment = 1
		else save_comment()
	}
	next
}

/^[ \t]*$/ {
	if (depth == 0) flush_group()
	next
}

depth > 0 {
	s = $0; sub(/\/\*.*/, "", s)
	depth += gsub(/{/, "{", s) - gsub(/}/, "}", s)
	if (depth < 0) depth = 0
	next
}

/^[ \t]*#[ \t]*define/ {
	# A #define among a group's declarations (the flags a function takes) is shown with them.
	if (ntext > 0 || ncode > 0) {
		code[++ncode] = $0
		if ($0 ~ /\\$/) indefine = 1
	}
	next
}

/^[ \t]*#/ || /^extern "C"/ || /^}[ \t]*$/ {
	flush_group()
	next
}

{
	s = $0
	trailing = ""
	if (match(s, /\/\*.*\*\//)) {
		trailing = comment_text(substr(s, RSTART))
		s = substr(s, 1, RSTART - 1)
	}
	if (decl == "" && index(s, "{")) {
		# A struct or enum: its comment documents no function.
		flush_group(); ntext = 0
		depth += gsub(/{/, "{", s) - gsub(/}/, "}", s)
		next
	}
	decl = decl " " s
	if (!index(s, ";"))
		next
	d = decl; decl = ""
	if (d !~ /^[ \t]*typedef/ && match(d, /[ *]pb_[a-z0-9_]+[ \t]*\(/)) {
		name = substr(d, RSTART + 1, RLENGTH - 1)
		sub(/[ \t]*\($/, "", name)
		is_func[name] = 1
		funcs = funcs (nfunc++ ? ", " : "") name
	} else if (ntext == 0 && ncode == 0) {
		next   # an undocumented typedef or other declaration
	}
	code[++ncode] = wrap_decl(d)
	if (trailing != "") {
		if (ntext > 0) add_text("")
		add_text(trailing)
	}
}

END {
	if (incomment || depth > 0) {
		print "gen-api-man.awk: " FILENAME " ends inside a comment or a brace" > "/dev/stderr"
		exit 1
	}
	flush_group()
	if (ngroups == 0) {
		print "gen-api-man.awk: no documented function in " FILENAME > "/dev/stderr"
		exit 1
	}
	if (template == "") {
		print_functions()
		exit 0
	}
	# The template, with its markers filled in.
	done = 0
	while ((r = (getline line < template)) > 0) {
		if (line == MARK "functions") {
			print_functions(); done = 1
		} else if (index(line, MARK "comment ") == 1) {
			print_comment(substr(line, length(MARK "comment ") + 1))
		} else
			print line
	}
	if (r < 0) {
		print "gen-api-man.awk: cannot read " template > "/dev/stderr"
		exit 1
	}
	if (!done) {
		print "gen-api-man.awk: " template " has no \"" MARK "functions\" line" > "/dev/stderr"
		exit 1
	}
}

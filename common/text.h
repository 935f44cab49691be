/* SPDX-License-Identifier: MIT */
/* Text from peers (labels, process names): UTF-8 decoding, the printable test, sanitising and C-style escaping. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/*
 * Decode the UTF-8 character at s[0..len). Returns its length in bytes (1 to 4)
 * and sets *cp, or 0 when s does not start with a valid sequence (a stray
 * continuation byte, an overlong form, a surrogate, a code point above
 * U+10FFFF, or a sequence cut short by len); *cp is then the first byte.
 */
size_t text_decode(const char *s, size_t len, uint32_t *cp);

/*
 * Whether a code point may be shown as it is. Not printable: C0 controls and
 * DEL (they move the cursor, end lines, start terminal escapes), C1 controls
 * U+0080-U+009F (8-bit CSI on some terminals), the line and paragraph
 * separators U+2028/U+2029, and the bidirectional controls U+200E/U+200F,
 * U+202A-U+202E and U+2066-U+2069 (they reorder what follows on screen).
 */
bool text_cp_printable(uint32_t cp);

/* Whether all of s is valid UTF-8 made of printable characters only. */
bool text_printable(const char *s);

/*
 * Copy src into dst (size bytes, always NUL-terminated when size > 0), each
 * byte of an unprintable or invalid character replaced by '?', cut at a
 * character boundary where it does not fit.
 */
void text_sanitize(char *dst, size_t size, const char *src);

/*
 * Copy src into dst C-escaped for a terminal: backslash as \\, newline, tab and
 * carriage return as \n \t \r, every other byte of an unprintable or invalid
 * character as \xNN; printable UTF-8 as it is. Never cuts an escape or a
 * character: where the rest does not fit, dst ends before it. Returns dst.
 */
char *text_escape(char *dst, size_t size, const char *src);

/* Cut s in place to at most max bytes, never inside a UTF-8 sequence. */
void text_truncate(char *s, size_t max);

/* SPDX-License-Identifier: MIT */
/* Text from peers (labels, process names): UTF-8 decoding, the printable test, sanitising and C-style escaping. */
#include "text.h"

#include <stdio.h>
#include <string.h>

size_t text_decode(const char *s, size_t len, uint32_t *cp)
{
	const unsigned char *p = (const unsigned char *)s;
	uint32_t c, min;
	size_t n;

	if (len == 0)
		return 0;
	c = p[0];
	*cp = c;
	if (c < 0x80)
		return 1;
	/* RFC 3629: lead bytes C0, C1 and F5-FF never occur; they could only start overlong or out-of-range forms. */
	if (c >= 0xc2 && c <= 0xdf) {
		n = 2;
		c &= 0x1f;
		min = 0x80;
	} else if (c >= 0xe0 && c <= 0xef) {
		n = 3;
		c &= 0x0f;
		min = 0x800;
	} else if (c >= 0xf0 && c <= 0xf4) {
		n = 4;
		c &= 0x07;
		min = 0x10000;
	} else {
		return 0;
	}
	if (len < n)
		return 0;
	for (size_t i = 1; i < n; i++) {
		if ((p[i] & 0xc0) != 0x80)
			return 0;
		c = (c << 6) | (p[i] & 0x3f);
	}
	if (c < min || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff))
		return 0;
	*cp = c;
	return n;
}

bool text_cp_printable(uint32_t cp)
{
	if (cp < 0x20 || cp == 0x7f || (cp >= 0x80 && cp < 0xa0))
		return false;
	if (cp == 0x2028 || cp == 0x2029 || cp == 0x200e || cp == 0x200f)
		return false;
	if ((cp >= 0x202a && cp <= 0x202e) || (cp >= 0x2066 && cp <= 0x2069))
		return false;
	return true;
}

/* Length of the printable character at s[0..len), or 0 when it is unprintable or invalid. */
static size_t printable_len(const char *s, size_t len)
{
	uint32_t cp;
	size_t n = text_decode(s, len, &cp);

	return n && text_cp_printable(cp) ? n : 0;
}

bool text_printable(const char *s)
{
	size_t len = strlen(s);

	for (size_t i = 0; i < len;) {
		size_t n = printable_len(s + i, len - i);

		if (!n)
			return false;
		i += n;
	}
	return true;
}

void text_sanitize(char *dst, size_t size, const char *src)
{
	size_t len = strlen(src), o = 0;

	if (size == 0)
		return;
	for (size_t i = 0; i < len;) {
		size_t n = printable_len(src + i, len - i);

		if (n == 0) {
			/* One '?' per bad byte: the next byte may start a good character. */
			if (o + 1 >= size)
				break;
			dst[o++] = '?';
			i++;
			continue;
		}
		if (o + n >= size)
			break;
		memcpy(dst + o, src + i, n);
		o += n;
		i += n;
	}
	dst[o] = '\0';
}

char *text_escape(char *dst, size_t size, const char *src)
{
	size_t len = strlen(src), o = 0;

	if (size == 0)
		return dst;
	for (size_t i = 0; i < len;) {
		size_t n = printable_len(src + i, len - i);
		char esc[8];
		const char *out = src + i;
		size_t outlen = n;

		if (n == 0 || src[i] == '\\') {
			unsigned char b = (unsigned char)src[i];

			if (b == '\\')
				out = "\\\\";
			else if (b == '\n')
				out = "\\n";
			else if (b == '\t')
				out = "\\t";
			else if (b == '\r')
				out = "\\r";
			else {
				snprintf(esc, sizeof(esc), "\\x%02x", b);
				out = esc;
			}
			outlen = strlen(out);
			n = 1; /* byte by byte: the next byte may start a good character */
		}
		if (o + outlen >= size)
			break;
		memcpy(dst + o, out, outlen);
		o += outlen;
		i += n;
	}
	dst[o] = '\0';
	return dst;
}

void text_truncate(char *s, size_t max)
{
	size_t len = strlen(s);

	if (len <= max)
		return;
	/* Back up over continuation bytes to the start of the character that straddles max. */
	while (max > 0 && ((unsigned char)s[max] & 0xc0) == 0x80)
		max--;
	s[max] = '\0';
}

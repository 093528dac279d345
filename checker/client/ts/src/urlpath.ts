// The checker's endpoint normal form (internal/urlpath in Go), so that the deny cache and the
// local buckets key on what the checker matches: another spelling of a denied path
// (/API/v1/search/, /api//v1/./search;x) finds the denial. The cases of
// test/urlpath-cases.json pin both implementations: the Go test checks the file against Go's,
// the TypeScript test this one against the file.

/** The reasons a path is refused, worded as the checker words them. */
export const pathErrors = {
  notAbsolute: 'must be an absolute path, starting with "/"',
  encodedSlash: "holds an encoded slash (%2F), which routers and backends read differently",
  backslash: 'holds a backslash ("\\" or %5C), which some backends read as "/"',
  control: "holds a control character (such as NUL or a line break), raw or percent-encoded",
  badEscape: 'holds a "%" not followed by two hexadecimal digits',
  aboveRoot: 'climbs above the root with ".."',
} as const;

/** A path normalizePath refuses; message is one of pathErrors. */
export class PathError extends Error {
  override name = "PathError";
}

const KEEP = 0, UPPER = 1, SLASH = 2, PERCENT = 3, PARAM = 4, ENCODE = 5, REFUSE = 6;

// classes holds each byte's class, as Go's urlpath does.
const classes = (() => {
  const c = new Uint8Array(256);
  for (let b = 0; b < 256; b++) {
    const ch = String.fromCharCode(b);
    if (b < 0x20 || b === 0x7f || ch === "\\") c[b] = REFUSE;
    else if (ch >= "A" && ch <= "Z") c[b] = UPPER;
    else if ((ch >= "a" && ch <= "z") || (ch >= "0" && ch <= "9") || "-._~!$&'()*+,=:@".includes(ch)) c[b] = KEEP;
    else if (ch === "/") c[b] = SLASH;
    else if (ch === "%") c[b] = PERCENT;
    else if (ch === ";") c[b] = PARAM;
    else c[b] = ENCODE;
  }
  return c;
})();

const unreserved = (b: number): boolean => /[A-Za-z0-9\-._~]/.test(String.fromCharCode(b));
const hex = (b: number): number => parseInt(String.fromCharCode(b), 16); // NaN when not a digit
const escape = (b: number): string => "%" + b.toString(16).toUpperCase().padStart(2, "0");
const refusal = (b: number): PathError => new PathError(b === 0x5c ? pathErrors.backslash : pathErrors.control);
const encoder = new TextEncoder();
// normalRE matches a path already in normal form with nothing to decode (most paths): returned
// as it is, with no copy, as Go's normal() does.
const normalRE = /^(?:\/(?!\.\.?(?:\/|$))[a-z0-9\-._~!$&'()*+,=:@]+)+$/;

/** Returns p's path (its query and fragment cut off) in the checker's normal form: segments
 * lower-cased, empty and "." segments dropped, ".." applied, ";" parameters dropped,
 * unreserved escapes decoded and other bytes percent-encoded in upper case. Throws a
 * PathError for a path the checker refuses. */
export function normalizePath(p: string): string {
  const cut = p.search(/[?#]/);
  if (cut >= 0) p = p.slice(0, cut);
  if (!p.startsWith("/")) throw new PathError(pathErrors.notAbsolute);
  if (p === "/" || normalRE.test(p)) return p;
  const b = encoder.encode(p);
  const segs: string[] = [];
  for (let i = 0; i < b.length; ) {
    i++; // b[i] was the '/' opening a segment
    let seg = "";
    let inParams = false;
    for (; i < b.length && b[i] !== 0x2f; i++) {
      const c = b[i];
      if (inParams && c !== 0x25) {
        if (classes[c] === REFUSE) throw refusal(c);
        continue;
      }
      switch (classes[c]) {
        case KEEP: seg += String.fromCharCode(c); break;
        case UPPER: seg += String.fromCharCode(c + 32); break;
        case PARAM: inParams = true; break;
        case ENCODE: seg += escape(c); break;
        case REFUSE: throw refusal(c);
        case PERCENT: {
          const d = (hex(b[i + 1]) << 4) | hex(b[i + 2]);
          if (i + 2 >= b.length || Number.isNaN(hex(b[i + 1])) || Number.isNaN(hex(b[i + 2]))) throw new PathError(pathErrors.badEscape);
          i += 2;
          if (d === 0x2f) throw new PathError(pathErrors.encodedSlash);
          if (classes[d] === REFUSE) throw refusal(d);
          if (inParams) break;
          seg += unreserved(d) ? String.fromCharCode(d).toLowerCase() : escape(d);
        }
      }
    }
    if (seg === "" || seg === ".") continue;
    if (seg === "..") {
      if (segs.pop() === undefined) throw new PathError(pathErrors.aboveRoot);
      continue;
    }
    segs.push(seg);
  }
  return "/" + segs.join("/");
}

// clientIP: the Go client's ClientIP(trusted), which believes X-Forwarded-For from trusted
// proxies only.
import { ConfigError } from "./types.js";

/** 16 bytes (IPv4 as ::ffff:a.b.c.d), or undefined when s is no address. */
function parseIP(s: string): Uint8Array | undefined {
  s = s.trim();
  if (s.startsWith("[") && s.endsWith("]")) s = s.slice(1, -1);
  const zone = s.indexOf("%");
  if (zone >= 0) s = s.slice(0, zone);
  const v4 = parseV4(s);
  if (v4) return Uint8Array.from([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, ...v4]);
  if (!s.includes(":")) return undefined;
  const halves = s.split("::");
  if (halves.length > 2) return undefined;
  const words = (part: string): number[] | undefined => {
    if (part === "") return [];
    const out: number[] = [];
    const groups = part.split(":");
    for (let i = 0; i < groups.length; i++) {
      const g = groups[i];
      if (i === groups.length - 1 && g.includes(".")) {
        const b = parseV4(g);
        if (!b) return undefined;
        out.push((b[0] << 8) | b[1], (b[2] << 8) | b[3]);
      } else if (/^[0-9a-fA-F]{1,4}$/.test(g)) out.push(parseInt(g, 16));
      else return undefined;
    }
    return out;
  };
  const head = words(halves[0]);
  const tail = halves.length === 2 ? words(halves[1]) : [];
  if (!head || !tail) return undefined;
  const fill = 8 - head.length - tail.length;
  if (halves.length === 2 ? fill < 1 : fill !== 0) return undefined;
  const all = [...head, ...new Array(fill).fill(0), ...tail];
  const out = new Uint8Array(16);
  all.forEach((w, i) => ((out[2 * i] = w >> 8), (out[2 * i + 1] = w & 0xff)));
  return out;
}

function parseV4(s: string): number[] | undefined {
  const p = s.split(".");
  if (p.length !== 4 || !p.every((x) => /^(0|[1-9][0-9]{0,2})$/.test(x) && Number(x) < 256)) return undefined;
  return p.map(Number);
}

const isV4 = (a: Uint8Array) => a.slice(0, 10).every((b) => b === 0) && a[10] === 0xff && a[11] === 0xff;

/** An address's text as Go's netip writes it (RFC 5952), IPv4-mapped ones unmapped. */
function formatIP(a: Uint8Array): string {
  if (isV4(a)) return `${a[12]}.${a[13]}.${a[14]}.${a[15]}`;
  const w = Array.from({ length: 8 }, (_, i) => (a[2 * i] << 8) | a[2 * i + 1]);
  let best = -1, bestLen = 1;
  for (let i = 0; i < 8; ) {
    let j = i;
    while (j < 8 && w[j] === 0) j++;
    if (j - i > bestLen) (best = i), (bestLen = j - i);
    i = j === i ? i + 1 : j;
  }
  const hex = (xs: number[]) => xs.map((x) => x.toString(16)).join(":");
  return best < 0 ? hex(w) : `${hex(w.slice(0, best))}::${hex(w.slice(best + bestLen))}`;
}

interface Prefix {
  addr: Uint8Array;
  bits: number;
}

function parsePrefix(s: string): Prefix | undefined {
  const [a, b] = s.trim().split("/");
  const addr = parseIP(a);
  if (!addr) return undefined;
  const v4 = isV4(addr) && !a.includes(":");
  if (b === undefined) return { addr, bits: 128 };
  if (!/^[0-9]{1,3}$/.test(b)) return undefined;
  const n = Number(b);
  if (n > (v4 ? 32 : 128)) return undefined;
  return { addr, bits: v4 ? n + 96 : n };
}

function contains(p: Prefix, a: Uint8Array): boolean {
  for (let i = 0; i < p.bits; i++) {
    const byte = i >> 3, bit = 0x80 >> (i & 7);
    if ((p.addr[byte] & bit) !== (a[byte] & bit)) return false;
  }
  return true;
}

/** An extractor of the client's IP that believes X-Forwarded-For only from trusted proxies
 * (networks or addresses): the client is the connection's peer unless that peer is trusted,
 * then the rightmost address of X-Forwarded-For that is not a trusted proxy. A bad entry of
 * trusted throws a ConfigError naming trustedProxies. */
export function clientIP(trusted: string[]): (peer: string | undefined, forwardedFor: string | string[] | undefined | null) => string {
  const prefixes = trusted.filter((s) => s.trim() !== "").map((s) => {
    const p = parsePrefix(s);
    if (!p) throw new ConfigError("trustedProxies", `${JSON.stringify(s)} is neither a CIDR nor an address`);
    return p;
  });
  const isTrusted = (a: Uint8Array) => prefixes.some((p) => contains(p, a));
  return (peer, forwardedFor) => {
    const p = peer === undefined ? undefined : parseIP(peer);
    if (!p) return "";
    let client = p;
    if (!isTrusted(client)) return formatIP(client);
    const xff = Array.isArray(forwardedFor) ? forwardedFor.join(",") : forwardedFor ?? "";
    const hops = xff.split(",");
    for (let i = hops.length - 1; i >= 0; i--) {
      const a = parseIP(hops[i]);
      if (!a) break; // a forged or broken hop: believe nothing left of it
      client = a;
      if (!isTrusted(client)) break;
    }
    return formatIP(client);
  };
}

// reach.ts: the addresses a destination that the API (or the page) set may connect to. Loopback, private
// (RFC 1918), carrier-grade NAT, link-local (the cloud metadata address among them), unique-local IPv6 and
// their IPv4-mapped forms are refused, unless the operator allows a range (INBOX_API_DESTINATIONS_ALLOW), and
// the ports of the inbox's own scripts always are there. Addresses are told by node:net's BlockList, never
// parsed by hand; a URL's host by the WHATWG parser, which writes every spelling (decimal, octal, mapped) one
// way. A name is checked on the address actually connected to, at every connection, through undici's own
// connector and its lookup (connector()). The operator's own destinations reach anything. See docs/security.md.

import type { LookupOptions } from "node:dns";
import { lookup } from "node:dns/promises";
import { BlockList, isIP } from "node:net";

// The ranges refused, most specific first, each with the name a refusal gives it. An IPv4 range also holds
// that range's IPv4-mapped IPv6 addresses (::ffff:a.b.c.d): BlockList matches them against IPv4 rules.
const RANGES: readonly { name: string; net: string; prefix: number }[] = [
  { name: "this host (0.0.0.0/8)", net: "0.0.0.0", prefix: 8 },
  { name: "loopback (127.0.0.0/8)", net: "127.0.0.0", prefix: 8 },
  { name: "private, RFC 1918 (10.0.0.0/8)", net: "10.0.0.0", prefix: 8 },
  { name: "private, RFC 1918 (172.16.0.0/12)", net: "172.16.0.0", prefix: 12 },
  { name: "private, RFC 1918 (192.168.0.0/16)", net: "192.168.0.0", prefix: 16 },
  { name: "carrier-grade NAT (100.64.0.0/10)", net: "100.64.0.0", prefix: 10 },
  { name: "link-local (169.254.0.0/16, the cloud metadata address among them)", net: "169.254.0.0", prefix: 16 },
  { name: "IETF protocol assignments (192.0.0.0/24)", net: "192.0.0.0", prefix: 24 },
  { name: "multicast (224.0.0.0/4)", net: "224.0.0.0", prefix: 4 },
  { name: "reserved (240.0.0.0/4)", net: "240.0.0.0", prefix: 4 },
  { name: "loopback (::1/128)", net: "::1", prefix: 128 },
  { name: "unspecified, this host (::/128)", net: "::", prefix: 128 },
  { name: "IPv4-compatible (::/96)", net: "::", prefix: 96 },
  { name: "unique-local (fc00::/7)", net: "fc00::", prefix: 7 },
  { name: "link-local (fe80::/10)", net: "fe80::", prefix: 10 },
  { name: "site-local (fec0::/10)", net: "fec0::", prefix: 10 },
  { name: "multicast (ff00::/8)", net: "ff00::", prefix: 8 },
];

const family = (address: string) => (isIP(address) === 6 ? "ipv6" : "ipv4");

// Each range on a list of its own, so a refusal can name it; and all of them on one, asked first.
const EACH = RANGES.map((r) => {
  const list = new BlockList();
  list.addSubnet(r.net, r.prefix, family(r.net));
  return { name: r.name, list };
});
const ANY = new BlockList();
for (const r of RANGES) ANY.addSubnet(r.net, r.prefix, family(r.net));

/** REFUSED_CODE is the code of the error a refused connection fails with: forward.ts tells it from the destination's own failures. */
export const REFUSED_CODE = "INBOX_ADDRESS_REFUSED";

/** RefusedAddress is a connection the rule refused before it was made; its message says why. */
export class RefusedAddress extends Error {
  readonly code = REFUSED_CODE;
}

/**
 * parseAllow reads INBOX_API_DESTINATIONS_ALLOW: comma-separated CIDRs (127.0.0.1/32, 10.1.0.0/16, fd00::/8).
 * It throws a TypeError naming the one that is not a range, and returns each as BlockList takes it.
 */
export function parseAllow(text: string | undefined): { net: string; prefix: number; family: "ipv4" | "ipv6" }[] {
  if (text === undefined || text.trim() === "") return [];
  return text
    .split(",")
    .map((s) => s.trim())
    .filter(Boolean)
    .map((cidr) => {
      const slash = cidr.lastIndexOf("/");
      const net = slash < 0 ? cidr : cidr.slice(0, slash);
      const v = isIP(net);
      const bits = v === 6 ? 128 : 32;
      const prefix = slash < 0 ? bits : Number(cidr.slice(slash + 1));
      if (v === 0 || !Number.isInteger(prefix) || prefix < 0 || prefix > bits || (slash >= 0 && cidr.endsWith("/")))
        throw new TypeError(
          `INBOX_API_DESTINATIONS_ALLOW: expected ranges such as 127.0.0.1/32 or 10.0.0.0/8, separated by commas; got ${JSON.stringify(cidr)}`,
        );
      return { net, prefix, family: v === 6 ? ("ipv6" as const) : ("ipv4" as const) };
    });
}

/** Resolver answers every address a host name has, as dns.lookup with all: true does. */
export type Resolver = (hostname: string) => Promise<{ address: string; family: number }[]>;

/** Reach is the rule for one process: the ranges the operator allows, and the ports of the inbox's own scripts. */
export class Reach {
  private readonly allow = new BlockList();
  private readonly allowed: string[];
  private readonly ownPorts: ReadonlySet<number>;
  private readonly resolver: Resolver;

  /**
   * allow: CIDRs from INBOX_API_DESTINATIONS_ALLOW (parseAllow's); ownPorts: the receiver's, the page's, the
   * metrics'; resolver: how names are resolved, at apply and at each connection. @default dns.lookup
   */
  constructor(
    options: { allow?: ReturnType<typeof parseAllow>; ownPorts?: Iterable<number>; resolver?: Resolver } = {},
  ) {
    for (const r of options.allow ?? []) this.allow.addSubnet(r.net, r.prefix, r.family);
    this.allowed = (options.allow ?? []).map((r) => `${r.net}/${r.prefix}`);
    this.ownPorts = new Set(options.ownPorts ?? []);
    this.resolver = options.resolver ?? ((hostname) => lookup(hostname, { all: true }));
  }

  /**
   * refusal says why an address (IPv4 or IPv6, as connected to) on a port may not be reached, or undefined
   * when it may: the public internet, or a range the operator allows, on a port none of the scripts use.
   */
  refusal(address: string, port: number): string | undefined {
    const type = family(address);
    if (isIP(address) === 0) return `${address} is not an address`;
    if (!ANY.check(address, type)) return undefined;
    if (this.allow.check(address, type))
      return this.ownPorts.has(port)
        ? `${address} port ${port} is one of the inbox's own scripts' ports, which no destination set through the API may reach`
        : undefined;
    const range = EACH.find((r) => r.list.check(address, type))!.name;
    return `${address} is ${range}, which a destination set through the API may not reach${this.allowed.length > 0 ? ` (INBOX_API_DESTINATIONS_ALLOW allows ${this.allowed.join(", ")})` : " unless INBOX_API_DESTINATIONS_ALLOW allows it"}`;
  }

  /** urlRefusal says why a URL whose host is an address, in any spelling, may not be reached; a name is left to resolve(). */
  urlRefusal(url: URL): string | undefined {
    const host = url.hostname.replace(/^\[|\]$/g, "");
    if (isIP(host) === 0) return undefined;
    return this.refusal(host, portOf(url));
  }

  /**
   * resolve says why a URL's host name resolves to an address that may not be reached, asking the resolver
   * now: at apply, for an early answer. A name that does not resolve now is left to the connection's check.
   */
  async resolve(url: URL): Promise<string | undefined> {
    const host = url.hostname.replace(/^\[|\]$/g, "");
    if (isIP(host) !== 0) return this.urlRefusal(url);
    let addresses: { address: string }[];
    try {
      addresses = await this.resolver(host);
    } catch {
      return undefined;
    }
    for (const { address } of addresses) {
      const why = this.refusal(address, portOf(url));
      if (why) return `${host} resolves to ${why}`;
    }
    return undefined;
  }

  /**
   * connector wraps undici's own (buildConnector, with base's options) so that every connection is checked
   * on the address it connects to: an address host before the socket is made, a name in the socket's own
   * lookup, where every address the resolver answers is checked before any is tried. A refusal fails the
   * connection with a RefusedAddress; redirects stay off (forward.ts follows none).
   */
  connector<C>(
    build: (options: Record<string, unknown>) => (opts: ConnectOptions, callback: ConnectCallback<C>) => unknown,
    base: Record<string, unknown>,
  ): (opts: ConnectOptions, callback: ConnectCallback<C>) => unknown {
    const byPort = new Map<number, ReturnType<typeof build>>();
    return (opts, callback) => {
      const port = Number(opts.port) || (opts.protocol === "https:" ? 443 : 80);
      const host = String(opts.hostname).replace(/^\[|\]$/g, "");
      if (isIP(host) !== 0) {
        const why = this.refusal(host, port);
        if (why) return callback(new RefusedAddress(`refused: ${why}`), null);
      }
      let connect = byPort.get(port);
      if (!connect) byPort.set(port, (connect = build({ ...base, lookup: this.lookup(port) })));
      return connect(opts, callback);
    };
  }

  // lookup is dns.lookup for net.connect and tls.connect, refusing when any address the name resolves to
  // may not be reached: the addresses checked are the ones the socket then tries, with nothing between.
  private lookup(port: number): LookupFunction {
    return (hostname, options, callback) => {
      const fail = (error: Error) => callback(error, options.all ? [] : "", 4);
      this.resolver(hostname).then((all) => {
        const addresses = options.family ? all.filter((a) => a.family === Number(options.family)) : all;
        if (addresses.length === 0)
          return fail(Object.assign(new Error(`${hostname}: no address`), { code: "ENOTFOUND" }));
        for (const { address } of addresses) {
          const why = this.refusal(address, port);
          if (why) return fail(new RefusedAddress(`refused: ${hostname} resolves to ${why}`));
        }
        if (options.all) return callback(null, addresses);
        return callback(null, addresses[0]!.address, addresses[0]!.family);
      }, fail);
    };
  }
}

// portOf is the port a URL connects to, its scheme's own when it names none.
function portOf(url: URL): number {
  return Number(url.port) || (url.protocol === "https:" ? 443 : 80);
}

/** ConnectOptions is what undici hands a connector: the origin to connect to. */
export interface ConnectOptions {
  hostname: string;
  protocol: string;
  port: string | number;
  [key: string]: unknown;
}

/** ConnectCallback is undici's connector callback. */
export type ConnectCallback<C> = (error: Error | null, socket: C | null) => void;

type LookupFunction = (
  hostname: string,
  options: LookupOptions,
  callback: (error: Error | null, address: string | { address: string; family: number }[], family?: number) => void,
) => void;

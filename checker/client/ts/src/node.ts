// The faster Node transport: @connectrpc/connect-node's HTTP/1.1 or HTTP/2 (h2c) client instead
// of fetch. An optional peer dependency: the core needs only fetch.
import { createConnectTransport, createGrpcTransport, createGrpcWebTransport } from "@connectrpc/connect-node";
import type { Interceptor, Transport } from "@connectrpc/connect";
import { Client } from "./client.js";
import type { ClientConfig } from "./types.js";

/** Options of createNodeTransport. */
export interface NodeTransportOptions {
  /** "connect" (the default), "grpc" (needs HTTP/2) or "grpc-web". */
  protocol?: "connect" | "grpc" | "grpc-web";
  /** "1.1" (the default for connect and grpc-web) or "2" (h2c, or HTTP/2 over TLS). */
  httpVersion?: "1.1" | "2";
  interceptors?: Interceptor[];
}

/** A Connect transport of Node's own http/http2 modules to the checker at baseUrl. */
export function createNodeTransport(baseUrl: string, o: NodeTransportOptions = {}): Transport {
  const common = { baseUrl, useBinaryFormat: true, interceptors: o.interceptors };
  if (o.protocol === "grpc") return createGrpcTransport({ ...common });
  if (o.protocol === "grpc-web") return createGrpcWebTransport({ ...common, httpVersion: o.httpVersion ?? "1.1" });
  return createConnectTransport({ ...common, httpVersion: o.httpVersion ?? "1.1" });
}

/** A Client of the checker at baseUrl over createNodeTransport. */
export function createNodeClient(baseUrl: string, config: ClientConfig & NodeTransportOptions = {}): Client {
  return new Client(baseUrl, { ...config, transport: config.transport ?? createNodeTransport(baseUrl, config) });
}

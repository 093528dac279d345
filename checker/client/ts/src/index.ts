// @quotaflow/client: the TypeScript client of quotaflow's check API.
export { Client, type Lease } from "./client.js";
export * from "./types.js";
export { clientIP } from "./clientip.js";
export { normalizePath, PathError, pathErrors } from "./urlpath.js";
export { rateLimitHeaders, denialBody, acceptsProblem, rateLimitField, rateLimitPolicyField, quotaExceededType, quotaExceededTitle } from "./headers.js";
export type { HttpConfig, DimensionHeader } from "./http.js";
export { RateLimiter } from "./gen/quotaflow/v1/ratelimit_pb.js";

// The gateway's defaults, in a module of their own: the CLI names them in --help without loading
// the gateway (libp2p, fastify).
export const GATEWAY_DEFAULT_PORT = 11435;
/** How long a provider may send nothing (before its answer starts, and between frames). */
export const PROVIDER_IDLE_DEFAULT_MS = 120_000;
/** How long a buyer may leave a streamed answer unread before the gateway takes them for gone. */
export const BUYER_IDLE_DEFAULT_MS = 120_000;

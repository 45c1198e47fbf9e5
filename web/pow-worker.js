// One share of a proof-of-work search (pow.js): nonces start, start+step, …
import { search } from "./pow.js";

self.onmessage = async (e) => {
  const { challenge, bits, start, step } = e.data;
  self.postMessage({ nonce: await search(challenge, bits, start, step) });
};

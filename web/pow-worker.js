// pow-worker.js: solves a campaign's proof-of-work challenge (pow.js) off
// the page's main thread, so the countdown and buttons stay responsive.
import { solve } from "./pow.js";

onmessage = async (e) => {
  try {
    postMessage({ nonce: await solve(e.data.challenge, e.data.bits) });
  } catch (err) {
    postMessage({ error: String(err) });
  }
};

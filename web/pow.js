// Proof of work for flashsale's gate against bots: find a nonce such that
// SHA-256(challenge + "." + nonce) has at least `bits` leading zero bits,
// the rule the gateway checks (internal/challenge, whose test runs this
// file under node). In a browser the search runs in Web Workers
// (pow-worker.js), one per core, so the page stays responsive; elsewhere
// (node) it runs in place. Dependency-free.

// SHA-256 round constants.
const K = new Uint32Array([
  0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
  0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
  0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
  0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
  0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
  0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
  0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
  0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
]);
const H0 = [0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19];

// sha256 writes SHA-256(msg) into out as eight big-endian words; w is
// scratch. Hand-written and synchronous: crypto.subtle.digest costs a
// promise per hash, ~12x slower for this search (docs/BENCHMARKS.md).
function sha256(msg, out, w) {
  const len = msg.length;
  const blocks = ((len + 9 + 63) >> 6);
  const h = H0.slice();
  for (let b = 0; b < blocks; b++) {
    for (let i = 0; i < 16; i++) {
      let word = 0;
      for (let j = 0; j < 4; j++) {
        const p = (b << 6) + (i << 2) + j;
        const byte = p < len ? msg[p] : p === len ? 0x80 : 0;
        word = (word << 8) | byte;
      }
      w[i] = word;
    }
    if (b === blocks - 1) {
      w[14] = Math.floor((len * 8) / 0x100000000);
      w[15] = (len * 8) >>> 0;
    }
    for (let i = 16; i < 64; i++) {
      const x = w[i - 15], y = w[i - 2];
      const s0 = ((x >>> 7) | (x << 25)) ^ ((x >>> 18) | (x << 14)) ^ (x >>> 3);
      const s1 = ((y >>> 17) | (y << 15)) ^ ((y >>> 19) | (y << 13)) ^ (y >>> 10);
      w[i] = (w[i - 16] + s0 + w[i - 7] + s1) | 0;
    }
    let [a, bb, c, d, e, f, g, hh] = h;
    for (let i = 0; i < 64; i++) {
      const S1 = ((e >>> 6) | (e << 26)) ^ ((e >>> 11) | (e << 21)) ^ ((e >>> 25) | (e << 7));
      const t1 = (hh + S1 + ((e & f) ^ (~e & g)) + K[i] + w[i]) | 0;
      const S0 = ((a >>> 2) | (a << 30)) ^ ((a >>> 13) | (a << 19)) ^ ((a >>> 22) | (a << 10));
      const t2 = (S0 + ((a & bb) ^ (a & c) ^ (bb & c))) | 0;
      hh = g; g = f; f = e; e = (d + t1) | 0; d = c; c = bb; bb = a; a = (t1 + t2) | 0;
    }
    h[0] = (h[0] + a) | 0; h[1] = (h[1] + bb) | 0; h[2] = (h[2] + c) | 0; h[3] = (h[3] + d) | 0;
    h[4] = (h[4] + e) | 0; h[5] = (h[5] + f) | 0; h[6] = (h[6] + g) | 0; h[7] = (h[7] + hh) | 0;
  }
  for (let i = 0; i < 8; i++) out[i] = h[i] >>> 0;
}

// leadingZeroBits counts the leading zero bits of a digest as 32-bit words.
function leadingZeroBits(words) {
  let n = 0;
  for (const x of words) {
    if (x !== 0) return n + Math.clz32(x);
    n += 32;
  }
  return n;
}

// search tries nonces start, start+step, … (base 36) and returns the first
// that solves the challenge. It yields to the event loop now and then, so
// a worker can be terminated and a page without workers stays alive.
export async function search(challenge, bits, start = 0, step = 1) {
  const prefix = new TextEncoder().encode(challenge + ".");
  const buf = new Uint8Array(prefix.length + 32);
  buf.set(prefix);
  const out = new Uint32Array(8);
  const w = new Int32Array(64);
  for (let i = start; ; i += step) {
    const nonce = i.toString(36);
    for (let j = 0; j < nonce.length; j++) buf[prefix.length + j] = nonce.charCodeAt(j);
    sha256(buf.subarray(0, prefix.length + nonce.length), out, w);
    if (leadingZeroBits(out) >= bits) return nonce;
    if ((i - start) % (step * 65536) === 0) await new Promise((r) => setTimeout(r, 0));
  }
}

// solve returns a nonce string for challenge at difficulty bits; send
// `${challenge}.${nonce}` as the purchase's Flashsale-Challenge header.
export async function solve(challenge, bits) {
  if (typeof Worker === "undefined" || typeof window === "undefined") {
    return search(challenge, bits);
  }
  const n = Math.max(1, Math.min(navigator.hardwareConcurrency || 2, 8));
  const workers = [];
  try {
    return await new Promise((resolve, reject) => {
      for (let w = 0; w < n; w++) {
        const worker = new Worker(new URL("./pow-worker.js", import.meta.url), { type: "module" });
        worker.onmessage = (e) => resolve(e.data.nonce);
        worker.onerror = (e) => reject(e.error || new Error(e.message));
        worker.postMessage({ challenge, bits, start: w, step: n });
        workers.push(worker);
      }
    });
  } finally {
    for (const worker of workers) worker.terminate();
  }
}

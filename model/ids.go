package model

// The id alphabets as sets of ASCII bytes: a low mask for bytes 0-63 and a
// high mask for 64-127. They are checked on every queue message, result
// lookup and payment webhook; a byte loop over constant masks costs a few nanoseconds
// where the regular expressions they replace cost a few hundred.
const (
	digitsLow  = (1<<10 - 1) << '0'        // 0-9
	upperHigh  = (1<<26 - 1) << ('A' - 64) // A-Z
	lowerHigh  = (1<<26 - 1) << ('a' - 64) // a-z
	hexLowHigh = (1<<6 - 1) << ('a' - 64)  // a-f

	campaignLow  = digitsLow | 1<<'-'                  // [A-Za-z0-9_-]
	campaignHigh = upperHigh | lowerHigh | 1<<('_'-64) //
	paymentLow   = campaignLow | 1<<'.' | 1<<':'       // [A-Za-z0-9_.@:-]
	paymentHigh  = campaignHigh | 1<<('@'-64)          //
	hexLow       = digitsLow                           // [0-9a-f]
	hexHigh      = hexLowHigh                          //
)

// inSet reports whether c is in the ASCII set given by its two masks.
func inSet(c byte, low, high uint64) bool {
	switch {
	case c < 64:
		return low&(1<<c) != 0
	case c < 128:
		return high&(1<<(c-64)) != 0
	}
	return false
}

// allInSet reports whether s has minLen to maxLen bytes, all in the set.
func allInSet(s string, minLen, maxLen int, low, high uint64) bool {
	if len(s) < minLen || len(s) > maxLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !inSet(s[i], low, high) {
			return false
		}
	}
	return true
}

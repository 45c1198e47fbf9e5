package sqlstore

import (
	"database/sql"
	"strings"
	"testing"

	"github.com/flashsale/flashsale/internal/testenv"
	"github.com/flashsale/flashsale/model"
)

// providerUsers are user ids as identity providers issue them, up to
// model.MaxUserID bytes, in one, two and four bytes a character.
var providerUsers = []string{
	"auth0|5f7c8ec7b4a1d2006b1f0e3a", "google-oauth2|1234", "google-oauth2|12", "Zoë|日本語",
	strings.Repeat("u", model.MaxUserID), strings.Repeat("é", 127) + "a", strings.Repeat("😀", 63) + "abc",
}

// TestProviderSubjectOrders: orders of any valid user id are stored and
// listed whole, each user's apart, on both drivers.
func TestProviderSubjectOrders(t *testing.T) {
	for driver, open := range openDBs(t) {
		t.Run(driver, func(t *testing.T) { checkProviderSubjectOrders(t, open(t)) })
	}
}

func checkProviderSubjectOrders(t *testing.T, db *DB) {
	campaign := testenv.Name(t, "subj-")
	orders := testOrders(campaign, 100, len(providerUsers)) // ids apart from the migration test's
	for i, user := range providerUsers {
		if !model.ValidUserID(user) || len(user) > model.MaxUserID {
			t.Fatalf("test user %q is not a valid user id", user)
		}
		orders[i].UserID = user
	}
	mustInsert(t, db, orders)
	for i, user := range providerUsers {
		got, _, err := db.UserOrders(t.Context(), user, "", 100)
		if err != nil || len(got) != 1 || got[0].ID != orders[i].ID || got[0].UserID != user {
			t.Fatalf("UserOrders(%q): got %+v, %v; want order %s alone", user, got, err, orders[i].ID)
		}
	}
}

// TestMigrateUserIDLength: an orders table whose user_id was sized for the
// old 128-byte ids is widened at Open, its rows kept.
func TestMigrateUserIDLength(t *testing.T) {
	dsn := testenv.MySQLDSN(t)
	raw, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	defer raw.Close()
	old := mustOpen(t, DriverMySQL, dsn)
	if _, err := raw.ExecContext(t.Context(), "ALTER TABLE `orders` MODIFY `user_id` varchar(128) NOT NULL"); err != nil {
		t.Fatalf("narrow user_id: %v", err)
	}
	kept := testOrders(testenv.Name(t, "subj-"), 0, 1)
	mustInsert(t, old, kept)
	_ = old.Close()

	db := mustOpen(t, DriverMySQL, dsn)
	var length int
	err = raw.QueryRowContext(t.Context(), "SELECT CHARACTER_MAXIMUM_LENGTH FROM information_schema.COLUMNS "+
		"WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'orders' AND COLUMN_NAME = 'user_id'").Scan(&length)
	if err != nil || length < model.MaxUserID {
		t.Fatalf("user_id length: got %d, %v; want at least %d", length, err, model.MaxUserID)
	}
	if got, _, err := db.UserOrders(t.Context(), kept[0].UserID, "", 10); err != nil || len(got) != 1 {
		t.Fatalf("order from before: got %+v, %v", got, err)
	}
	checkProviderSubjectOrders(t, db)
}

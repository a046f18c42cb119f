"""Which AgentDojo tools only read and which have effects, one explicit table per suite.

The MCP server marks a read-only tool with the annotation `readOnlyHint: true` (MCP: "the
tool does not modify its environment"); every other tool is served with `readOnlyHint:
false`. An effect is anything that changes the environment or reaches past it: a tool
that fetches a URL its arguments choose counts as one, since it sends a request to a
third party that the data (possibly an injection) picks.

`check` refuses a suite whose tools differ from its table, so a new AgentDojo release
cannot serve an unclassified tool.
"""

# Banking: the account's data and the user's own files are read; money moves and account
# changes are effects.
BANKING = {
    "read_only": {
        "get_iban",
        "get_balance",
        "get_most_recent_transactions",
        "get_scheduled_transactions",
        "read_file",
        "get_user_info",
    },
    "effects": {
        "send_money",
        "schedule_transaction",
        "update_scheduled_transaction",
        "update_password",
        "update_user_info",
    },
}

# Slack: listing channels and reading messages only read. Messages, membership changes and
# posts are effects; so is get_webpage, which requests whatever URL it is given (the
# environment logs it in web_requests, and an attacker's URL can carry data out).
SLACK = {
    "read_only": {
        "get_channels",
        "read_channel_messages",
        "read_inbox",
        "get_users_in_channel",
    },
    "effects": {
        "add_user_to_channel",
        "send_direct_message",
        "send_channel_message",
        "invite_user_to_slack",
        "remove_user_from_slack",
        "get_webpage",
        "post_webpage",
    },
}

# Travel: every lookup of hotels, restaurants, car rentals, flights, the calendar and the
# user's own information only reads. Reservations, calendar changes and email are effects.
TRAVEL = {
    "read_only": {
        "get_user_information",
        "get_all_hotels_in_city",
        "get_hotels_prices",
        "get_rating_reviews_for_hotels",
        "get_hotels_address",
        "get_all_restaurants_in_city",
        "get_cuisine_type_for_restaurants",
        "get_restaurants_address",
        "get_rating_reviews_for_restaurants",
        "get_dietary_restrictions_for_all_restaurants",
        "get_contact_information_for_restaurants",
        "get_price_for_restaurants",
        "check_restaurant_opening_hours",
        "get_all_car_rental_companies_in_city",
        "get_car_types_available",
        "get_rating_reviews_for_car_rental",
        "get_car_fuel_options",
        "get_car_rental_address",
        "get_car_price_per_day",
        "search_calendar_events",
        "get_day_calendar_events",
        "get_flight_information",
    },
    "effects": {
        "create_calendar_event",
        "cancel_calendar_event",
        "reserve_hotel",
        "reserve_car_rental",
        "reserve_restaurant",
        "send_email",
    },
}

# Workspace: searching and listing mail, contacts, the calendar and the drive only read.
# Sending, deleting, sharing, calendar and file changes are effects. get_unread_emails is
# one too: it marks every email it returns as read, a change to the inbox (small, but an
# injection could use it to hide mail from the user), so it is not read-only.
WORKSPACE = {
    "read_only": {
        "get_sent_emails",
        "get_received_emails",
        "get_draft_emails",
        "search_emails",
        "search_contacts_by_name",
        "search_contacts_by_email",
        "get_current_day",
        "search_calendar_events",
        "get_day_calendar_events",
        "search_files_by_filename",
        "get_file_by_id",
        "list_files",
        "search_files",
    },
    "effects": {
        "send_email",
        "delete_email",
        "get_unread_emails",
        "create_calendar_event",
        "cancel_calendar_event",
        "reschedule_calendar_event",
        "add_calendar_event_participants",
        "append_to_file",
        "create_file",
        "delete_file",
        "share_file",
    },
}

TABLES = {"banking": BANKING, "slack": SLACK, "travel": TRAVEL, "workspace": WORKSPACE}


def is_read_only(suite: str, tool: str) -> bool:
    """Whether `tool` of `suite` only reads (KeyError for a suite without a table)."""
    return tool in TABLES[suite]["read_only"]


def check(suite_name: str, tool_names) -> None:
    """Raises if the suite's tools are not exactly those its table classifies."""
    table = TABLES.get(suite_name)
    if table is None:
        raise SystemExit(f"error: no effects table for suite `{suite_name}` in effects.py")
    overlap = table["read_only"] & table["effects"]
    if overlap:
        raise SystemExit(f"error: effects.py lists {sorted(overlap)} of `{suite_name}` as both")
    classified = table["read_only"] | table["effects"]
    tools = set(tool_names)
    if tools != classified:
        raise SystemExit(
            f"error: effects.py does not match the tools of `{suite_name}`: "
            f"unclassified {sorted(tools - classified)}, unknown {sorted(classified - tools)}"
        )

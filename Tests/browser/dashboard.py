"""Drives the dashboard in headless Chromium (Debian's chromium + chromium-driver) with selenium.

Usage: dashboard.py BASE_URL TOKEN SUB JTI XSS_SUB WEBHOOK_ID ARTIFACTS_DIR ACCOUNTS_TOKEN
Exits 0 when every check passes; prints what failed otherwise. Screenshots go to ARTIFACTS_DIR:
dashboard-1280.png, dashboard-1920.png, dashboard-390.png (whole pages), dashboard-detail.png and
dashboard-user.png (the notification detail and the user view, as the viewport shows them),
dashboard-transfers.png (signed in again with ACCOUNTS_TOKEN, which adds accounts:read).
"""
import os
import sys

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import WebDriverWait

base, token, sub, jti, xss_sub, webhook_id, artifacts, accounts_token = sys.argv[1:9]
options = webdriver.ChromeOptions()
options.binary_location = "/usr/bin/chromium"
for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,900", "--hide-scrollbars"):
    options.add_argument(argument)
driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
wait = WebDriverWait(driver, 20)


def viewport(width, height):
    """Lays the page out at exactly `width` x `height` CSS px (a phone's at 390: mobile, meta viewport)."""
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": width < 500})
    inner = driver.execute_script("return [window.innerWidth, window.innerHeight]")
    assert inner == [width, height], f"the viewport is {inner}, not {width}x{height}"


def screenshot(name, width, height, whole_page):
    """Saves the viewport, or the whole page (the viewport stretched to the page's height)."""
    if whole_page:
        full = driver.execute_script("return Math.max(document.documentElement.scrollHeight, document.body.scrollHeight)")
        viewport(width, max(height, full))
    driver.save_screenshot(os.path.join(artifacts, name))
    viewport(width, height)


# Every word of every visible table cell under `root`, and the ones the browser laid out over more
# than one line: a word split across lines gives rects on more than one line.
SPLIT_WORDS = """
const root = arguments[0];
let words = 0;
const split = [];
for (const td of root.querySelectorAll('td')) {
  if (!td.getClientRects().length) continue;
  const walker = document.createTreeWalker(td, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    for (const match of node.data.matchAll(/\\S+/g)) {
      const range = document.createRange();
      range.setStart(node, match.index);
      range.setEnd(node, match.index + match[0].length);
      const lines = new Set(Array.from(range.getClientRects()).filter(r => r.width > 0 && r.height > 0).map(r => Math.round(r.top)));
      words++;
      if (lines.size > 1) split.push(match[0]);
    }
  }
}
return [words, split];
"""


# Badges, tags and counts whose text is below WCAG AA contrast (4.5:1) against their background.
LOW_CONTRAST = """
const rgb = (text) => text.match(/[\\d.]+/g).slice(0, 3).map(Number);
const luminance = ([r, g, b]) => {
  const [R, G, B] = [r, g, b].map(v => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); });
  return 0.2126 * R + 0.7152 * G + 0.0722 * B;
};
let checked = 0;
const low = [];
for (const e of document.querySelectorAll('.badge, .tag, .count, .lane')) {
  if (!e.getClientRects().length) continue;
  const style = getComputedStyle(e);
  const a = luminance(rgb(style.color)), b = luminance(rgb(style.backgroundColor));
  const ratio = (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
  checked++;
  if (ratio < 4.5) low.push(e.textContent + ' ' + ratio.toFixed(2));
}
return [checked, low];
"""


def low_contrast():
    checked, low = driver.execute_script(LOW_CONTRAST)
    assert checked > 0 and not low, f"badges below 4.5:1 contrast: {low}"


def split_words(selector):
    return driver.execute_script(SPLIT_WORDS, driver.find_element(By.CSS_SELECTOR, selector))


def in_viewport(selector):
    """The element's box, and whether it lies inside the viewport."""
    return driver.execute_script(
        """const r = document.querySelector(arguments[0]).getBoundingClientRect();
        return [[r.left, r.top, r.right, r.bottom, window.innerWidth, window.innerHeight],
                r.width > 0 && r.height > 0 && r.top >= 0 && r.left >= 0 && r.bottom <= window.innerHeight && r.right <= window.innerWidth];""",
        selector)


def rows(selector):
    """Each row's text plus the full values of its shortened ids, read in one go in the page (a
    table is replaced as results land)."""
    return driver.execute_script(
        """return Array.from(document.querySelectorAll(arguments[0]),
            r => r.textContent + ' ' + Array.from(r.querySelectorAll('[data-full]'), e => e.dataset.full).join(' '))""", selector)


def only(text):
    """The results hold rows, and every one of them is about `text` (the search has landed: the
    unfiltered list shown at sign-in holds other users' rows)."""
    def check(_):
        found = rows("#results tbody tr")
        return bool(found) and all(text in row for row in found)
    return check


def search(value):
    field = driver.find_element(By.CSS_SELECTOR, "#search input[name=sub]")
    field.clear()
    field.send_keys(value)
    driver.find_element(By.CSS_SELECTOR, "#search button").click()
    wait.until(only(value))


def close(dialog):
    driver.find_element(By.CSS_SELECTOR, f"#{dialog} [data-close]").click()
    wait.until(lambda d: not d.execute_script(f"return document.getElementById('{dialog}').open"))


try:
    viewport(1280, 900)
    driver.get(base + "/")
    assert not driver.find_element(By.ID, "app").is_displayed(), "the dashboard shows before sign-in"
    # A wrong token is refused with a message; the right one signs in.
    driver.find_element(By.ID, "token").send_keys("siwa_wrong")
    driver.find_element(By.CSS_SELECTOR, "#signin-form button").click()
    wait.until(EC.text_to_be_present_in_element((By.ID, "signin-error"), "unknown"))
    field = driver.find_element(By.ID, "token")
    field.clear()
    field.send_keys(token)
    driver.find_element(By.CSS_SELECTOR, "#signin-form button").click()
    wait.until(EC.visibility_of_element_located((By.ID, "search")))
    assert driver.execute_script("return sessionStorage.getItem('siwa-token')") == token, "token not in sessionStorage"
    assert driver.execute_script("return localStorage.length") == 0, "something was put in localStorage"

    # Trouble first: the firing alert, the unhealthy endpoint and the discarded revocation, at the
    # top of the first screen, each a link to its card.
    wait.until(EC.text_to_be_present_in_element((By.ID, "trouble-items"), "unhealthy"))
    wait.until(EC.text_to_be_present_in_element((By.ID, "trouble-items"), "revocation_spike"))
    trouble = driver.find_element(By.ID, "trouble-items").text
    assert "1 alert firing: revocation_spike" in trouble, f"trouble: {trouble!r}"
    assert "The endpoint Apple posts to is unhealthy" in trouble, f"trouble: {trouble!r}"
    assert "1 Apple token revocation discarded: its token stays unrevoked" in trouble, f"trouble: {trouble!r}"
    box, inside = in_viewport("#trouble")
    assert inside, f"the trouble card is not on the first screen at 1280 px: {box}"
    links = driver.execute_script("return Array.from(document.querySelectorAll('#trouble-items a'), a => a.getAttribute('href'))")
    assert links == ["#alerts-title", "#endpoint-title", "#alerts-title"], f"trouble links: {links}"

    # Everything loaded: the chart with its axes, the firing alert first, rejections with counts.
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#chart rect.bar")) > 0)
    ticks = driver.execute_script("return Array.from(document.querySelectorAll('#chart text'), t => t.textContent)")
    assert "per hour" in ticks and any(t.startswith("day (UTC)") for t in ticks), f"the chart's axes are not labelled: {ticks}"
    assert sum(1 for t in ticks if t[:3] in ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")) >= 6, f"no dates: {ticks}"
    hover = driver.execute_script("return Array.from(document.querySelectorAll('#chart rect.hover title'), t => t.textContent).filter(t => !/: 0 /.test(t))")
    assert hover and " UTC: " in hover[-1] and "revocations" in hover[-1], f"no values on hover: {hover}"
    wait.until(EC.text_to_be_present_in_element((By.CSS_SELECTOR, "#alerts tbody tr.firing"), "revocation_spike"))
    assert "42" in driver.find_element(By.CSS_SELECTOR, "#alerts tbody tr.firing").text, "the alert's peak is not shown"
    assert "1 firing" in driver.find_element(By.ID, "alerts-counts").text, "the firing count is missing"
    # Apple token revocations Apple has not taken: one discarded, with what to run.
    revocations = driver.find_element(By.ID, "revocations-note").text
    assert "1 discarded" in revocations and "apple retry --discarded" in revocations, f"revocations note: {revocations!r}"
    # The endpoint card: the latest check, unhealthy on tls, each finding as text (never markup).
    wait.until(EC.visibility_of_element_located((By.ID, "endpoint-card")))
    assert driver.find_element(By.ID, "endpoint-status").text.startswith("unhealthy"), driver.find_element(By.ID, "endpoint-status").text
    checks = driver.find_element(By.ID, "endpoint-checks").text
    assert "fail tls" in checks and "<b>wrong.example</b>" in checks, f"endpoint checks: {checks!r}"
    assert not driver.find_elements(By.CSS_SELECTOR, "#endpoint-checks b"), "a finding was read as markup"
    assert "siwa.example.com" in driver.find_element(By.ID, "endpoint-facts").text
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#rejections tbody tr")) >= 2)
    counts = driver.find_element(By.ID, "rejection-counts").text
    assert "1 unsupported_algorithm" in counts and "1 wrong_issuer" in counts, f"rejection counts: {counts!r}"

    # No table cell wraps inside a word at 1280 px. The check itself catches a split word.
    probe = driver.execute_script(
        """const t = document.createElement('table'); const td = t.insertRow().insertCell();
        td.textContent = 'consent-revoked 2026-11-25T14:20:42Z'; td.style.wordBreak = 'break-all'; td.style.whiteSpace = 'normal';
        t.style.width = '40px'; t.style.tableLayout = 'fixed'; document.body.append(t); return t;""")
    assert driver.execute_script(SPLIT_WORDS, probe)[1], "the split-word check does not see a split word"
    driver.execute_script("arguments[0].remove()", probe)
    for table in ("#results", "#alerts", "#rejections"):
        words, split = split_words(table)
        assert words > 0, f"{table} has no words to check"
        assert not split, f"{table}: words split over lines at 1280 px: {split}"
    assert driver.execute_script("return document.documentElement.scrollWidth <= document.documentElement.clientWidth"), "horizontal scroll at 1280 px"
    # Statuses and types are told apart by colour and by their word, readable either way.
    low_contrast()
    looks = driver.execute_script(
        """const looks = {};
        for (const e of document.querySelectorAll('#results .badge, #results .tag')) {
          const s = getComputedStyle(e), dot = getComputedStyle(e, '::before');
          looks[e.textContent] = [s.color, s.backgroundColor, s.borderRadius, dot.backgroundColor].join(' ');
        }
        return looks;""")
    assert len(looks) >= 4 and len(set(looks.values())) == len(looks), f"statuses and types look alike: {looks}"

    # Search the seeded user: their notification is listed, its ids shortened with the whole value kept.
    search(sub)
    assert any(jti in row for row in rows("#results tbody tr")), "the seeded notification is not listed"
    short = driver.find_element(By.CSS_SELECTOR, f"#results tbody tr[data-jti='{jti}'] .id[data-full='{jti}']")
    assert short.text != jti and "…" in short.text and short.get_attribute("title") == jti, f"the jti is not shortened: {short.text!r}"
    assert driver.find_elements(By.CSS_SELECTOR, f"#results tbody tr[data-jti='{jti}'] button.copy"), "no copy button"
    screenshot("dashboard-1280.png", 1280, 900, whole_page=True)

    # The detail: verification facts, the callback (its webhook-id) and every attempt of every lane.
    driver.find_element(By.CSS_SELECTOR, f"#results tbody tr[data-jti='{jti}'] td:first-child").click()
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#attempts tbody tr")) >= 3)
    box, inside = in_viewport("#detail")
    assert inside, f"the detail is not in the viewport: {box}"
    facts = driver.find_element(By.ID, "facts").text
    assert "RS256" in facts and "https://appleid.apple.com" in facts and "consent-revoked" in facts, f"verification facts: {facts!r}"
    attempts = [r.split("\n") for r in driver.execute_script(
        "return Array.from(document.querySelectorAll('#attempts tbody tr'), r => Array.from(r.cells, c => c.textContent).join('\\n'))")]
    lanes = [(a[0], a[1], a[2], a[3]) for a in attempts]
    assert lanes == [("effects", "1", "applied", "–"), ("callbacks", "1", "retrying", "500"), ("callbacks", "2", "delivered", "200")], f"attempts: {lanes}"
    assert "consent_revoked" in attempts[0][6], f"the applied effect is not shown: {attempts[0]}"
    callback = driver.find_element(By.ID, "callback")
    assert callback.find_element(By.CSS_SELECTOR, f"[data-full='{webhook_id}']"), "the webhook-id is not shown"
    assert "completed" in callback.text and "200" in callback.text and "/siwa/callbacks" in callback.text, f"callback: {callback.text!r}"
    for table in ("#jobs", "#attempts"):
        words, split = split_words(table)
        assert words > 0 and not split, f"{table}: words split over lines at 1280 px: {split}"
    low_contrast()
    screenshot("dashboard-detail.png", 1280, 900, whole_page=False)
    close("detail")

    # Choosing a user opens their view in place, in the viewport: sessions and timeline.
    driver.execute_script("window.scrollTo(0, document.body.scrollHeight)")
    driver.find_element(By.CSS_SELECTOR, f"#results tbody tr[data-jti='{jti}'] td.sub button.link").click()
    wait.until(EC.text_to_be_present_in_element((By.ID, "timeline"), "consent-revoked"))
    for selector in ("#user", "#user-title", "#timeline"):
        box, inside = in_viewport(selector)
        assert inside, f"{selector} is not in the viewport after choosing a user: {box}"
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#sessions tbody tr")) >= 1)
    assert "revoked" in driver.find_element(By.CSS_SELECTOR, "#sessions tbody").text, "the revoked session is not shown as revoked"
    # This token lacks accounts:read: the page says addresses are withheld.
    wait.until(EC.visibility_of_element_located((By.ID, "email-note")))
    assert "accounts:read" in driver.find_element(By.ID, "email-note").text, "the withheld-email note is missing"
    assert "withheld" in driver.find_element(By.CSS_SELECTOR, "#timeline tbody").text, "the timeline does not say the email is withheld"
    for table in ("#sessions", "#timeline"):
        words, split = split_words(table)
        assert words > 0 and not split, f"{table}: words split over lines at 1280 px: {split}"
    screenshot("dashboard-user.png", 1280, 900, whole_page=False)
    close("user")

    # Attacker-controlled values stay text: the markup in this sub never becomes an element, in
    # the list or in the detail.
    search(xss_sub)
    assert driver.execute_script("return window.__xss === undefined"), "a value from the data ran as script"
    assert not driver.find_elements(By.CSS_SELECTOR, "#results tbody img"), "a value from the data became markup"
    driver.find_element(By.CSS_SELECTOR, "#results tbody tr td:first-child").click()
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#attempts tbody tr")) >= 1)
    assert not driver.find_elements(By.CSS_SELECTOR, "#detail img"), "a value from the data became markup in the detail"
    assert driver.execute_script("return window.__xss === undefined"), "a value from the data ran as script"
    close("detail")

    # Wide and phone widths: the whole list again; no horizontal page scroll.
    field = driver.find_element(By.CSS_SELECTOR, "#search input[name=sub]")
    field.clear()
    driver.find_element(By.CSS_SELECTOR, "#search button").click()
    wait.until(lambda d: len(rows("#results tbody tr")) >= 4)
    for width, height in ((1920, 1080), (390, 844)):
        viewport(width, height)
        # The chart is redrawn to its box's new width.
        wait.until(lambda d: d.execute_script("const c = document.getElementById('chart'); return c.querySelector('svg').getAttribute('width') == c.clientWidth"))
        scroll = driver.execute_script("return [document.documentElement.scrollWidth, document.documentElement.clientWidth]")
        assert scroll[0] <= scroll[1], f"horizontal page scroll at {width} px: {scroll}"
        driver.execute_script("window.scrollTo(0, 0)")
        box, inside = in_viewport("#trouble")
        assert inside, f"the trouble card is not on the first screen at {width} px: {box}"
        screenshot(f"dashboard-{width}.png", width, height, whole_page=True)
    # At phone width a rejection's message, cut to its cell, shows whole on a tap.
    message = driver.find_element(By.CSS_SELECTOR, "#rejections tbody .clip.message")
    driver.execute_script("arguments[0].scrollIntoView()", message)
    message.click()
    assert message.get_attribute("aria-expanded") == "true", "a tap did not expand the message"
    assert driver.execute_script("return arguments[0].scrollWidth <= arguments[0].clientWidth + 1", message), "the expanded message is still cut"
    # At phone width the user view still opens in view, as wide as the screen at most.
    driver.find_element(By.CSS_SELECTOR, "#results tbody td.sub button.link").click()
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#timeline tbody tr")) >= 1)
    box, inside = in_viewport("#user")
    assert inside, f"the user view is not in the viewport at 390 px: {box}"
    close("user")
    # Without accounts:read the transfers card names the scope; with it, each transfer's window and users left.
    note = driver.find_element(By.ID, "transfers-note")
    assert note.is_displayed() and "accounts:read" in note.text, f"transfers note: {note.text!r}"
    assert not driver.find_elements(By.CSS_SELECTOR, "#transfers tbody tr"), "transfers shown without accounts:read"
    viewport(1280, 900)
    driver.find_element(By.ID, "signout").click()
    field = driver.find_element(By.ID, "token")
    field.clear()
    field.send_keys(accounts_token)
    driver.find_element(By.CSS_SELECTOR, "#signin-form button").click()
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#transfers tbody tr")) >= 1)
    assert driver.find_element(By.ID, "alerts-counts").text == "", "the alert counts of the previous token are still shown"
    trouble = driver.find_element(By.ID, "trouble-items").text
    assert "firing" not in trouble, f"the previous token's alerts are still in the trouble card: {trouble!r}"
    assert not driver.find_element(By.ID, "transfers-note").is_displayed(), "the scope note shows with accounts:read"
    transfer = driver.find_element(By.CSS_SELECTOR, "#transfers tbody tr").text
    assert "to TEAMB23456" in transfer and "13 days left" in transfer, f"the transfer row: {transfer!r}"
    cells = driver.execute_script("return Array.from(document.querySelectorAll('#transfers tbody tr:first-child td.num'), c => c.textContent)")
    assert cells == ["3", "1", "0", "2"], f"users, done, refused, left: {cells}"
    assert "1 closing with users left" in driver.find_element(By.ID, "transfers-counts").text, "the closing count is missing"
    words, split = split_words("#transfers")
    assert words > 0 and not split, f"#transfers: words split over lines at 1280 px: {split}"
    driver.execute_script("document.getElementById('transfers-card').scrollIntoView()")
    screenshot("dashboard-transfers.png", 1280, 900, whole_page=False)
    print("dashboard: all checks passed")
except Exception as error:  # noqa: BLE001 - report any failure with the page state
    driver.save_screenshot(os.path.join(artifacts, "dashboard-failure.png"))
    print("dashboard check failed:", repr(error))
    print(driver.page_source[:4000])
    sys.exit(1)
finally:
    driver.quit()

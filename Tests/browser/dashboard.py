"""Drives the dashboard in headless Chromium (Debian's chromium + chromium-driver) with selenium.

Usage: dashboard.py BASE_URL TOKEN SUB JTI XSS_SUB SCREENSHOT
Exits 0 when every check passes; prints what failed otherwise.
"""
import sys

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import WebDriverWait

base, token, sub, jti, xss_sub, screenshot = sys.argv[1:7]
options = webdriver.ChromeOptions()
options.binary_location = "/usr/bin/chromium"
for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1800"):
    options.add_argument(argument)
driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
wait = WebDriverWait(driver, 20)
try:
    driver.get(base + "/")
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
    # Search the seeded user and find their notification.
    def only(text):
        """The results hold rows, and every one of them shows `text` (the search has landed: the
        unfiltered list shown at sign-in holds other users' rows)."""
        def check(d):
            # Read the rows in one go in the page: the table is replaced as results land.
            rows = d.execute_script("return Array.from(document.querySelectorAll('#results tbody tr'), r => r.textContent)")
            return bool(rows) and all(text in row for row in rows)
        return check

    driver.find_element(By.CSS_SELECTOR, "#search input[name=sub]").send_keys(sub)
    driver.find_element(By.CSS_SELECTOR, "#search button").click()
    wait.until(only(sub))
    assert jti in driver.find_element(By.CSS_SELECTOR, "#results tbody").text, "the seeded notification is not listed"
    # Their timeline.
    driver.find_element(By.CSS_SELECTOR, "#results tbody button.link").click()
    wait.until(EC.text_to_be_present_in_element((By.ID, "timeline"), "consent-revoked"))
    # This token lacks accounts:read: the page says addresses are withheld.
    wait.until(EC.visibility_of_element_located((By.ID, "email-note")))
    assert "accounts:read" in driver.find_element(By.ID, "email-note").text, "the withheld-email note is missing"
    assert "withheld" in driver.find_element(By.CSS_SELECTOR, "#timeline tbody").text, "the timeline does not say the email is withheld"
    # The firing alert is listed (alerts:read), first.
    wait.until(EC.text_to_be_present_in_element((By.CSS_SELECTOR, "#alerts tbody tr.firing"), "revocation_spike"))
    assert "42" in driver.find_element(By.CSS_SELECTOR, "#alerts tbody tr.firing").text, "the alert's peak is not shown"
    # The chart drew bars from the stats.
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#chart rect")) > 0)
    # Attacker-controlled values stay text: the markup in this sub never becomes an element.
    field = driver.find_element(By.CSS_SELECTOR, "#search input[name=sub]")
    field.clear()
    field.send_keys(xss_sub)
    driver.find_element(By.CSS_SELECTOR, "#search button").click()
    wait.until(only(xss_sub))
    assert driver.execute_script("return window.__xss === undefined"), "a value from the data ran as script"
    assert not driver.find_elements(By.CSS_SELECTOR, "#results tbody img"), "a value from the data became markup"
    driver.save_screenshot(screenshot)
    print("dashboard: all checks passed")
except Exception as error:  # noqa: BLE001 - report any failure with the page state
    driver.save_screenshot(screenshot)
    print("dashboard check failed:", repr(error))
    print(driver.page_source[:4000])
    sys.exit(1)
finally:
    driver.quit()

# C declarations of sites.py for its compiled build (see resources/tracking/marks.pxd).

cpdef object user_site()
